package billing

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the worker's Prometheus metrics of period close.
type Metrics struct {
	periodsClosed prometheus.Counter
	// oldestUnclosed is the end of the oldest period due and not closed, as of the
	// last close scan (0: none).
	oldestUnclosed prometheus.Gauge
}

// NewMetrics registers the metrics on reg (nil: they are kept but not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		periodsClosed: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_periods_closed_total",
			Help: "Billing periods closed by this worker."}),
		oldestUnclosed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_worker_oldest_unclosed_period_end_timestamp_seconds",
			Help: "Unix time of the end of the oldest billing period that is due (ended, plus the grace) and not closed, as of the last close scan; 0 when none is."}),
	}
	if reg != nil {
		reg.MustRegister(m.periodsClosed, m.oldestUnclosed)
	}
	return m
}
