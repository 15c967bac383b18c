package worker

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics registers on reg a collector of River's jobs by kind and state
// (quotaplane_worker_jobs), read from pool at scrape time.
func RegisterMetrics(reg prometheus.Registerer, pool *pgxpool.Pool) {
	reg.MustRegister(&jobStates{pool: pool, desc: prometheus.NewDesc("quotaplane_worker_jobs",
		"River jobs by kind and state.", []string{"kind", "state"}, nil)})
}

// jobStates reads River's job table at scrape time.
type jobStates struct {
	pool *pgxpool.Pool
	desc *prometheus.Desc
}

// Describe sends the one descriptor.
func (j *jobStates) Describe(ch chan<- *prometheus.Desc) { ch <- j.desc }

// Collect counts River's jobs by kind and state.
func (j *jobStates) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := j.pool.Query(ctx, `SELECT kind, state::text, count(*) FROM river_job GROUP BY 1, 2`)
	if err != nil {
		return
	}
	defer rows.Close()
	for rows.Next() {
		var kind, state string
		var n int64
		if rows.Scan(&kind, &state, &n) == nil {
			ch <- prometheus.MustNewConstMetric(j.desc, prometheus.GaugeValue, float64(n), kind, state)
		}
	}
}
