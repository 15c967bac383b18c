package ledger

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/quota"
)

// Metrics are the worker's Prometheus metrics of usage persistence.
type Metrics struct {
	flushLag       prometheus.GaugeFunc
	lastFlush      atomic.Int64 // unix nanoseconds
	flushDuration  prometheus.Histogram
	rowsFlushed    prometheus.Counter
	flushErrors    prometheus.Counter
	lastFlushUnixS prometheus.Gauge
	tickOrgs       prometheus.Gauge
	tickDirty      prometheus.Gauge
	tickBudget     prometheus.Gauge
	util           *utilization
	inFlight       *inFlightTop
}

// NewMetrics registers the metrics on reg (nil: they are kept but not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		flushDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "quotaplane_worker_flush_duration_seconds",
			Help: "Duration of one usage flush of every org.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		rowsFlushed: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_usage_rows_flushed_total",
			Help: "Usage counters written to Postgres (stored value raised)."}),
		flushErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_worker_flush_errors_total",
			Help: "Org flushes that failed (retried with a full read next tick)."}),
		lastFlushUnixS: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_worker_last_flush_timestamp_seconds",
			Help: "Unix time of the start of the last complete usage flush."}),
		tickOrgs: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_worker_flush_orgs",
			Help: "Orgs the last usage flush visited (those with new usage, and every org on the first flush)."}),
		tickDirty: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_worker_flush_dirty_orgs",
			Help: "Orgs the last usage flush popped from the dirty-org indexes."}),
		tickBudget: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_worker_flush_budget_ratio",
			Help: "Duration of the last usage flush over the flush interval: at 1 the flush takes all of its tick."}),
		util:     newUtilization(UtilizationTop, time.Now),
		inFlight: &inFlightTop{top: UtilizationTop, m: map[string]map[inFlightKey]int64{}},
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
		reg.MustRegister(m.flushLag, m.flushDuration, m.rowsFlushed, m.flushErrors, m.lastFlushUnixS, m.util, m.inFlight,
			m.tickOrgs, m.tickDirty, m.tickBudget)
	}
	return m
}

// tick records what one flush did and the share of its interval it took.
func (m *Metrics) tick(st FlushStats, took, interval time.Duration) {
	m.tickOrgs.Set(float64(st.Orgs))
	m.tickDirty.Set(float64(st.Dirty))
	if interval > 0 {
		m.tickBudget.Set(took.Seconds() / interval.Seconds())
	}
}

// flushed records a complete flush that started at start.
func (m *Metrics) flushed(start time.Time) {
	m.lastFlush.Store(start.UnixNano())
	m.lastFlushUnixS.Set(float64(start.UnixNano()) / 1e9)
	m.flushDuration.Observe(time.Since(start).Seconds())
}

// UtilizationTop bounds quotaplane_worker_month_utilization_ratio to the series of
// the highest ratios, so its org label stays bounded however many orgs there are.
const UtilizationTop = 20

var utilizationDesc = prometheus.NewDesc("quotaplane_worker_month_utilization_ratio",
	"Highest used / month limit of a level (org, team or user) of an org for a metric in the current period, from the ledger (read at start and every minute) and the usage flushed since; only the 20 highest series are exported.",
	[]string{"org", "level", "metric"}, nil)

type utilKey struct{ org, level, metric, period string }

type utilValue struct {
	ratio float64
	end   time.Time // the period's end: the value is dropped after it
}

// utilization remembers, per org, level and metric, the highest ratio of a counter
// to its month limit seen by the flusher in the current period: in the counters it
// flushes, and in the ledger's stored usage it reads at start and every
// FlusherConfig.UtilizationEvery (so a restarted worker exports an org at 100 % at
// once). Usage only grows
// within a period, so the highest ratio seen is the level's; a limit lowered since is
// seen when the counter next changes.
type utilization struct {
	top   int
	clock func() time.Time
	mu    sync.Mutex
	m     map[utilKey]utilValue
}

func newUtilization(top int, clock func() time.Time) *utilization {
	return &utilization{top: top, clock: clock, m: map[utilKey]utilValue{}}
}

func (u *utilization) observe(org, period string, end time.Time, level, metric string, ratio float64) {
	if u == nil {
		return
	}
	k := utilKey{org, level, metric, period}
	u.mu.Lock()
	defer u.mu.Unlock()
	if v, ok := u.m[k]; !ok || ratio > v.ratio {
		u.m[k] = utilValue{ratio: ratio, end: end}
	}
}

// Describe sends the one descriptor.
func (u *utilization) Describe(ch chan<- *prometheus.Desc) { ch <- utilizationDesc }

// Collect drops the ratios of ended periods and sends the top highest.
func (u *utilization) Collect(ch chan<- prometheus.Metric) {
	now := u.clock()
	type kv struct {
		k utilKey
		v float64
	}
	u.mu.Lock()
	all := make([]kv, 0, len(u.m))
	for k, v := range u.m {
		if !now.Before(v.end) {
			delete(u.m, k)
			continue
		}
		all = append(all, kv{k, v.ratio})
	}
	u.mu.Unlock()
	sort.Slice(all, func(i, j int) bool {
		if all[i].v != all[j].v {
			return all[i].v > all[j].v
		}
		a, b := all[i].k, all[j].k
		return a.org+"|"+a.level+"|"+a.metric < b.org+"|"+b.level+"|"+b.metric
	})
	for _, e := range all[:min(len(all), u.top)] {
		ch <- prometheus.MustNewConstMetric(utilizationDesc, prometheus.GaugeValue, e.v, e.k.org, e.k.level, e.k.metric)
	}
}

// Concurrency limits (vocab.Concurrent): the units held at once by open reservations.

var inFlightDesc = prometheus.NewDesc("quotaplane_worker_in_flight_units",
	"Units held at once by open reservations against concurrent limits: per org, level and metric, the most of any counter of the level (an org, a team or a user), as of the last flush that drained a reservation of the org; only the 20 highest series are exported.",
	[]string{"org", "level", "metric"}, nil)

type inFlightKey struct{ level, metric string }

// inFlightTop keeps each org's in-flight units as last read: every reservation opened
// or settled is drained by the flush, which then reads the org's in-flight hash, so the
// reading changes whenever in-flight does.
type inFlightTop struct {
	top int
	mu  sync.Mutex
	m   map[string]map[inFlightKey]int64
}

// set replaces org's reading (per level and metric, the highest counter's).
func (t *inFlightTop) set(org string, byCounter map[quota.Counter]int64) {
	if t == nil {
		return
	}
	vals := map[inFlightKey]int64{}
	for c, v := range byCounter {
		k := inFlightKey{string(c.Level), c.Metric}
		if v > vals[k] {
			vals[k] = v
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(vals) == 0 {
		delete(t.m, org)
		return
	}
	t.m[org] = vals
}

// Describe sends the one descriptor.
func (t *inFlightTop) Describe(ch chan<- *prometheus.Desc) { ch <- inFlightDesc }

// Collect sends the top highest series.
func (t *inFlightTop) Collect(ch chan<- prometheus.Metric) {
	type kv struct {
		org string
		k   inFlightKey
		v   int64
	}
	t.mu.Lock()
	var all []kv
	for org, m := range t.m {
		for k, v := range m {
			all = append(all, kv{org, k, v})
		}
	}
	t.mu.Unlock()
	sort.Slice(all, func(i, j int) bool {
		if all[i].v != all[j].v {
			return all[i].v > all[j].v
		}
		a, b := all[i], all[j]
		return a.org+"|"+a.k.level+"|"+a.k.metric < b.org+"|"+b.k.level+"|"+b.k.metric
	})
	for _, e := range all[:min(len(all), t.top)] {
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(e.v), e.org, e.k.level, e.k.metric)
	}
}
