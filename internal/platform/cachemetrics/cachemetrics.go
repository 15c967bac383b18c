// Package cachemetrics counts the lookups and evictions of the in-process caches of
// both binaries in one pair of metric families with a cache label:
// quotaplane_cache_lookups_total{cache,result} and
// quotaplane_cache_evictions_total{cache}. Each cache gets its Hooks from For and
// calls them; a cache does not need to know Prometheus.
package cachemetrics

import "github.com/prometheus/client_golang/prometheus"

// Hooks are what a cache calls: Hit and Miss on each lookup, Evict when the size bound
// pushed an entry out. Every field is set (to a no-op when nothing counts).
type Hooks struct {
	Hit, Miss, Evict func()
}

func nop() {}

// Nop returns hooks that count nothing.
func Nop() Hooks { return Hooks{Hit: nop, Miss: nop, Evict: nop} }

// OrNop returns h with its nil fields set to no-ops.
func (h Hooks) OrNop() Hooks {
	if h.Hit == nil {
		h.Hit = nop
	}
	if h.Miss == nil {
		h.Miss = nop
	}
	if h.Evict == nil {
		h.Evict = nop
	}
	return h
}

// Metrics are the two families, registered once per process.
type Metrics struct {
	lookups   *prometheus.CounterVec
	evictions *prometheus.CounterVec
}

// New registers the families on reg (nil: counted but not exported).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotaplane_cache_lookups_total",
			Help: "Lookups of an in-process cache, by cache and result (hit or miss)."}, []string{"cache", "result"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotaplane_cache_evictions_total",
			Help: "Entries an in-process cache dropped to stay within its size bound, by cache."}, []string{"cache"}),
	}
	if reg != nil {
		reg.MustRegister(m.lookups, m.evictions)
	}
	return m
}

// For returns the hooks of the cache named (orgs, users, keys, ...). A nil *Metrics
// returns no-ops, so a cache built without metrics needs no special case.
func (m *Metrics) For(cache string) Hooks {
	if m == nil {
		return Nop()
	}
	return Hooks{Hit: m.lookups.WithLabelValues(cache, "hit").Inc, Miss: m.lookups.WithLabelValues(cache, "miss").Inc,
		Evict: m.evictions.WithLabelValues(cache).Inc}
}
