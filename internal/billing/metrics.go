package billing

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the worker's Prometheus metrics of usage persistence, jobs and webhooks.
type Metrics struct {
	flushLag       prometheus.GaugeFunc
	lastFlush      atomic.Int64 // unix nanoseconds
	flushDuration  prometheus.Histogram
	rowsFlushed    prometheus.Counter
	flushErrors    prometheus.Counter
	webhookFailed  prometheus.Counter
	webhookSent    prometheus.Counter
	periodsClosed  prometheus.Counter
	lastFlushUnixS prometheus.Gauge
}

// NewMetrics registers the metrics on reg (nil: they are kept but not exported), and
// a collector of River jobs by state when pool is not nil.
func NewMetrics(reg prometheus.Registerer, pool *pgxpool.Pool) *Metrics {
	m := &Metrics{
		flushDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "quotaplane_worker_flush_duration_seconds",
			Help: "Duration of one usage flush of every org.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		rowsFlushed: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_usage_rows_flushed_total",
			Help: "Usage counters written to Postgres (stored value raised)."}),
		flushErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_flush_errors_total",
			Help: "Org flushes that failed (retried with a full read next tick)."}),
		webhookFailed: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_webhook_failures_total",
			Help: "Webhook delivery attempts that failed."}),
		webhookSent: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_webhook_deliveries_total",
			Help: "Webhook deliveries acknowledged with a 2xx."}),
		periodsClosed: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_periods_closed_total",
			Help: "Billing periods closed by this worker."}),
		lastFlushUnixS: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_worker_last_flush_timestamp_seconds",
			Help: "Unix time of the start of the last complete usage flush."}),
	}
	m.flushLag = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "quotaplane_worker_flush_lag_seconds",
		Help: "Seconds since the start of the last complete usage flush: the usage a Redis restart may lose."},
		func() float64 {
			last := m.lastFlush.Load()
			if last == 0 {
				return 0
			}
			return time.Since(time.Unix(0, last)).Seconds()
		})
	if reg != nil {
		reg.MustRegister(m.flushLag, m.flushDuration, m.rowsFlushed, m.flushErrors, m.webhookFailed, m.webhookSent,
			m.periodsClosed, m.lastFlushUnixS)
		if pool != nil {
			reg.MustRegister(&jobStates{pool: pool, desc: prometheus.NewDesc("quotaplane_worker_jobs",
				"River jobs by kind and state.", []string{"kind", "state"}, nil)})
		}
	}
	return m
}

// flushed records a complete flush that started at start.
func (m *Metrics) flushed(start time.Time) {
	m.lastFlush.Store(start.UnixNano())
	m.lastFlushUnixS.Set(float64(start.UnixNano()) / 1e9)
	m.flushDuration.Observe(time.Since(start).Seconds())
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
