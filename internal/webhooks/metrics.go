package webhooks

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the worker's Prometheus metrics of webhook deliveries.
type Metrics struct {
	failed prometheus.Counter
	sent   prometheus.Counter
}

// NewMetrics registers the metrics on reg (nil: they are kept but not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_webhook_failures_total",
			Help: "Webhook delivery attempts that failed."}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_webhook_deliveries_total",
			Help: "Webhook deliveries acknowledged with a 2xx."}),
	}
	if reg != nil {
		reg.MustRegister(m.failed, m.sent)
	}
	return m
}
