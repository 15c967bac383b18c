package quota

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// enginesMetrics are the router's Prometheus metrics. Labels are bounded: pool
// names come from configuration (every dedicated Redis is pool "dedicated"), plan
// ids from the operator's plans, and the one org label (quotaplane_org_checks_total)
// is capped by EnginesConfig.MetricsOrgs; there is no team or user label.
type enginesMetrics struct {
	checks    *prometheus.CounterVec   // decision, blocked_level, mode, degraded
	duration  *prometheus.HistogramVec // pool, degraded
	counters  sync.Map                 // checkLabels -> prometheus.Counter
	observers sync.Map                 // durationLabels -> prometheus.Observer
	pipeSize  *prometheus.HistogramVec // pool
	rtt       *prometheus.HistogramVec // pool
	resends   *prometheus.CounterVec   // pool, reason
	badReply  *prometheus.CounterVec   // pool
	bounded   *prometheus.CounterVec   // pool
	refused   *prometheus.CounterVec   // org, bound: checks past an org's bound on Redis (bounds.go)

	reservations *prometheus.CounterVec // event: opened, committed, released, expired
	overUnits    prometheus.Counter     // units committed beyond their reservation

	leases       *prometheus.CounterVec // event: taken, returned, failed
	leaseUnits   *prometheus.CounterVec // event: leased, used, returned
	leaseChecks  *prometheus.CounterVec // answer: leased, miss
	leasedChecks prometheus.Counter     // leaseChecks{answer="leased"}
	leaseMisses  prometheus.Counter     // leaseChecks{answer="miss"}

	capDraws *prometheus.CounterVec // capacity, answer: granted, full, share
	capUsed  *prometheus.GaugeVec   // capacity: used in its window at the last draw
	capLimit *prometheus.GaugeVec   // capacity

	planChecks *prometheus.CounterVec // plan, decision, degraded
	orgChecks  *prometheus.CounterVec // org, decision
	scopedMu   sync.RWMutex           // a map under RLock: a struct key of strings does not allocate, a sync.Map key would
	plans      map[planLabels]prometheus.Counter
	orgLabels  *orgLabels
}

type planLabels struct{ plan, decision, degraded string }

// MetricsOrgs converts a configured count of orgs with their own series, where 0
// means none, to EnginesConfig.MetricsOrgs, where 0 means the default.
func MetricsOrgs(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// OtherOrgs is the org label of the checks of orgs beyond EnginesConfig.MetricsOrgs.
const OtherOrgs = "_other"

func newEnginesMetrics(r *Engines, reg prometheus.Registerer) (*enginesMetrics, error) {
	m := &enginesMetrics{
		planChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_plan_checks_total",
			Help: "Checks answered by the router, by the org's plan (none when unknown), decision (allowed, denied or error) and degraded (true when a fail mode answered).",
		}, []string{"plan", "decision", "degraded"}),
		orgChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_org_checks_total",
			Help: "Checks answered by the router, by org and decision; at most QUOTA_METRICS_ORGS orgs have a label on this replica, the busiest of the last minute, the others are counted as org \"_other\".",
		}, []string{"org", "decision"}),
		plans: map[planLabels]prometheus.Counter{},
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_checks_total",
			Help: "Checks answered by the router. decision is allowed, denied or error; blocked_level is org, team, user or empty; mode is the enforcement mode; degraded is true when a fail mode answered.",
		}, []string{"decision", "blocked_level", "mode", "degraded"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quotaplane_check_duration_seconds",
			Help:    "Time to answer one check (or one item of a batch), including degraded answers.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"pool", "degraded"}),
		pipeSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quotaplane_redis_pipeline_size",
			Help:    "Commands per pipeline the engine sends to Redis: concurrent single checks coalesced, or one batch.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256},
		}, []string{"pool"}),
		rtt: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "quotaplane_redis_roundtrip_seconds",
			Help:    "Round-trip time of one pipeline to Redis.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"pool"}),
		resends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "quotaplane_redis_resends_total",
			Help: "Checks sent again because a Redis Cluster refused them without running them. reason is the refusal (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, MASTERDOWN, READONLY, LOADING) or dial.",
		}, []string{"pool", "reason"}),
	}
	m.badReply = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotaplane_script_reply_errors_total",
		Help: "Checks and reservations whose script answered what the engine cannot read, or failed as it ran (a value stored in Redis it cannot read): each answered by the plan's fail mode, never tripping the pool's breaker.",
	}, []string{"pool"})
	m.bounded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotaplane_counters_at_bound_total",
		Help: "Checks (and reservations) that found a counter at its bound, 2^51 (quota.MaxCounter): a value stored out of range, read as the bound, or a counter full. A limited counter there is over every limit (denied in enforce); one with no limit (usage and billing only) saturates: it stays at the bound, the units past it not counted, and never denies. An operator corrects either with POST /v1/orgs/{org}/usage/adjustments.",
	}, []string{"pool"})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotaplane_org_bound_refusals_total",
		Help: "Checks and reservations refused because they would take their org past one of its bounds on the shared Redis: bound is idempotency_records (QUOTA_IDEMPOTENCY_RECORDS) or unregistered_users (QUOTA_UNREGISTERED_USERS, per period). Series exist only for orgs that reached a bound.",
	}, []string{"org", "bound"})
	m.reservations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotaplane_reservations_total",
		Help: "Reservations opened and settled by this process. event is opened, committed, released or expired (settled by its on_expiry).",
	}, []string{"event"})
	m.overUnits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quotaplane_reservation_over_reserved_units_total",
		Help: "Units committed beyond the amount reserved (counted in full), settled by this process.",
	})
	m.leases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotaplane_leases_total",
		Help: "Leases of hot paths taken and settled by this replica. event is taken, returned (committed what it admitted, gave the rest back), expired (its expiry committed all of it before this replica settled it) or failed (not settled: its expiry commits all of it).",
	}, []string{"event"})
	m.leaseUnits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotaplane_lease_units_total",
		Help: "Units of leases: leased (reserved), used (admitted from them and committed), returned (given back) and unused_counted (not admitted but counted as used, since the lease's expiry committed all of it: a settlement that failed or came too late).",
	}, []string{"event"})
	m.leaseChecks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotaplane_lease_checks_total",
		Help: "Checks of hot paths: answer is leased (admitted in process from a lease) or miss (sent to Redis: no lease fitted, or one was being taken).",
	}, []string{"answer"})
	m.leasedChecks, m.leaseMisses = m.leaseChecks.WithLabelValues("leased"), m.leaseChecks.WithLabelValues("miss")
	m.capDraws = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quotaplane_capacity_draws_total",
		Help: "Draws of this replica on a capacity in Redis (a grant for a member's checks). capacity is the operator's capacity id, or fair_share for an org limit shared by its teams; answer is granted, full (the capacity had no room) or share (the member was past its fair share above the saturation point).",
	}, []string{"capacity", "answer"})
	m.capUsed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "quotaplane_capacity_used_units",
		Help: "Units used in a capacity's sliding window (granted to every replica), as this replica's last draw on it saw them. capacity as in quotaplane_capacity_draws_total.",
	}, []string{"capacity"})
	m.capLimit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "quotaplane_capacity_limit_units",
		Help: "A capacity's limit per window, as this replica last drew on it.",
	}, []string{"capacity"})
	m.orgLabels = newOrgLabels(m.orgChecks, max(r.cfg.MetricsOrgs, 0), r.cfg.MetricsOrgsWindow)
	m.preinit()
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.capDraws, m.capUsed, m.capLimit, m.badReply, m.bounded, m.refused, m.leases, m.leaseUnits, m.leaseChecks, m.reservations, m.overUnits, m.checks, m.duration, m.pipeSize, m.rtt, m.resends, m.planChecks, m.orgChecks, &poolCollector{r: r}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// capacityDraw records a draw's answer. An org limit's fair share is labelled
// fair_share: a label per org would grow with the tenants.
func (m *enginesMetrics) capacityDraw(d *CapacityDraw, rep drawReply) {
	id := d.ID
	if d.FairShare {
		id = "fair_share"
	}
	answer := "granted"
	switch rep.why {
	case "c":
		answer = "full"
	case "f":
		answer = "share"
	}
	m.capDraws.WithLabelValues(id, answer).Inc()
	if !d.FairShare {
		m.capUsed.WithLabelValues(id).Set(float64(rep.used))
		m.capLimit.WithLabelValues(id).Set(float64(d.Limit))
	}
}

// replyError counts a check or reservation whose script reply was unreadable.
func (m *enginesMetrics) replyError(pool string) { m.badReply.WithLabelValues(pool).Inc() }

// boundRefusal counts a check or reservation refused past its org's bound (bounds.go).
func (m *enginesMetrics) boundRefusal(err error) {
	var be *BoundError
	if errors.As(err, &be) {
		m.refused.WithLabelValues(be.Org, be.Bound).Inc()
	}
}

// atBound counts a check whose reply shows a counter at MaxCounter, or that saturated
// a counter no limit bounds (stopped it there, the units past it not counted).
func (m *enginesMetrics) atBound(pool string, res *vocab.Result) {
	if res.Saturated {
		m.bounded.WithLabelValues(pool).Inc()
		return
	}
	for i := range res.Levels {
		if res.Levels[i].Used >= MaxCounter {
			m.bounded.WithLabelValues(pool).Inc()
			return
		}
	}
}

// observe records one answered check (a nil route counts under plan "none").
func (m *enginesMetrics) observe(pool string, route *vocab.Route, req *Request, res *vocab.Result, err error, degraded bool, start time.Time) {
	decision, level := "allowed", ""
	switch {
	case err != nil:
		decision = "error"
	case !res.Allowed:
		decision = "denied"
		if res.BlockedAt != nil {
			level = string(res.BlockedAt.Level)
		}
	}
	mode := string(req.Mode)
	switch req.Mode {
	case vocab.Enforce, vocab.Shadow, vocab.Warn:
	case "":
		mode = string(vocab.Enforce)
	default:
		mode = "invalid"
	}
	deg := "false"
	if degraded {
		deg = "true"
	}
	m.counter(checkLabels{decision, level, mode, deg}).Inc()
	if res != nil && res.Leased {
		m.leasedChecks.Inc()
	}
	plan := "none"
	if route != nil && route.Plan != "" {
		plan = route.Plan
	}
	m.scoped(plan, req.Org, decision, deg)
	if pool != "" && !errors.Is(err, ErrInvalid) {
		m.observer(durationLabels{pool, deg}).Observe(time.Since(start).Seconds())
	}
}

var (
	breakerStateDesc = prometheus.NewDesc("quotaplane_breaker_state",
		"Circuit breaker state per pool: 0 closed, 1 half-open, 2 open (for pool \"dedicated\", the worst of all dedicated Redis).",
		[]string{"pool"}, nil)
	inflightDesc = prometheus.NewDesc("quotaplane_inflight",
		"Checks in flight per pool (for pool \"dedicated\", summed over all dedicated Redis).",
		[]string{"pool"}, nil)
)

// poolCollector reads breaker states and in-flight counts at scrape time, so the
// hot path only touches atomics.
type poolCollector struct{ r *Engines }

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- breakerStateDesc
	ch <- inflightDesc
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	type agg struct {
		state    float64
		inflight int64
	}
	pools := map[string]*agg{}
	c.r.backends.Range(func(_, v any) bool {
		b := v.(*backendEntry).ready()
		if b == nil {
			return true
		}
		a := pools[b.name]
		if a == nil {
			a = &agg{}
			pools[b.name] = a
		}
		a.state = max(a.state, float64(b.state()))
		a.inflight += b.inflight.Load()
		return true
	})
	for name, a := range pools {
		ch <- prometheus.MustNewConstMetric(breakerStateDesc, prometheus.GaugeValue, a.state, name)
		ch <- prometheus.MustNewConstMetric(inflightDesc, prometheus.GaugeValue, float64(a.inflight), name)
	}
}

type checkLabels struct{ decision, level, mode, degraded string }
type durationLabels struct{ pool, degraded string }

// counter returns the checks counter of labels, looked up once: WithLabelValues
// hashes its labels on every call, twice per check.
func (m *enginesMetrics) counter(l checkLabels) prometheus.Counter {
	if c, ok := m.counters.Load(l); ok {
		return c.(prometheus.Counter)
	}
	c := m.checks.WithLabelValues(l.decision, l.level, l.mode, l.degraded)
	m.counters.Store(l, c)
	return c
}

// observer returns the duration histogram of labels, looked up once.
func (m *enginesMetrics) observer(l durationLabels) prometheus.Observer {
	if o, ok := m.observers.Load(l); ok {
		return o.(prometheus.Observer)
	}
	o := m.duration.WithLabelValues(l.pool, l.degraded)
	m.observers.Store(l, o)
	return o
}

// scoped counts a check in the plan and org families (the org's label: orgLabels).
func (m *enginesMetrics) scoped(plan, org, decision, degraded string) {
	pl := planLabels{plan, decision, degraded}
	m.scopedMu.RLock()
	pc, ok := m.plans[pl]
	m.scopedMu.RUnlock()
	if !ok {
		pc = m.planSlow(pl)
	}
	pc.Inc()
	m.orgLabels.count(org, decision)
}

// planSlow creates the series of a plan seen for the first time: every decision and
// degraded value of it at once, at 0, so the first denial of a plan is seen by rate().
func (m *enginesMetrics) planSlow(pl planLabels) prometheus.Counter {
	m.scopedMu.Lock()
	defer m.scopedMu.Unlock()
	for _, d := range decisions {
		for _, deg := range []string{"false", "true"} {
			l := planLabels{pl.plan, d, deg}
			if _, ok := m.plans[l]; !ok {
				m.plans[l] = m.planChecks.WithLabelValues(l.plan, l.decision, l.degraded)
			}
		}
	}
	if c, ok := m.plans[pl]; ok {
		return c
	}
	c := m.planChecks.WithLabelValues(pl.plan, pl.decision, pl.degraded) // a decision outside decisions: none today
	m.plans[pl] = c
	return c
}

// decisions are the values of the decision label.
var decisions = []string{"allowed", "denied", "error"}

// preinit creates at 0 the series the rules read: a counter that appears at 1 with
// its first event is a step rate() never sees. quotaplane_checks_total for every
// decision, blocked level, mode and degraded; the plan family for plan "none"; the org
// family for "_other". Named plans and orgs get all their decisions at 0 with their
// first check.
func (m *enginesMetrics) preinit() {
	for _, mode := range []vocab.Mode{vocab.Enforce, vocab.Shadow, vocab.Warn} {
		for _, deg := range []string{"false", "true"} {
			m.counter(checkLabels{"allowed", "", string(mode), deg})
			m.counter(checkLabels{"error", "", string(mode), deg})
			for _, level := range []string{"org", "team", "user"} {
				m.counter(checkLabels{"denied", level, string(mode), deg})
			}
		}
	}
	m.planSlow(planLabels{"none", "allowed", "false"})
}

// reservation records one reservation opened or settled.
func (m *enginesMetrics) reservation(ev ReservationEvent) {
	name := string(ev.State)
	if ev.State == vocab.Held {
		name = "opened"
	}
	m.reservations.WithLabelValues(name).Inc()
	if ev.OverReserved > 0 {
		m.overUnits.Add(float64(ev.OverReserved))
	}
}

// lease records one lease event of an engine.
func (m *enginesMetrics) lease(ev LeaseEvent) {
	switch ev.Kind {
	case LeaseTaken:
		m.leases.WithLabelValues("taken").Inc()
		m.leaseUnits.WithLabelValues("leased").Add(float64(ev.Units))
	case LeaseReturned:
		m.leases.WithLabelValues("returned").Inc()
		m.leaseUnits.WithLabelValues("used").Add(float64(ev.Used))
		m.leaseUnits.WithLabelValues("returned").Add(float64(ev.Units))
	case LeaseExpired, LeaseFailed:
		name := "expired"
		if ev.Kind == LeaseFailed {
			name = "failed"
		}
		m.leases.WithLabelValues(name).Inc()
		m.leaseUnits.WithLabelValues("used").Add(float64(ev.Used))
		m.leaseUnits.WithLabelValues("unused_counted").Add(float64(ev.Units - ev.Used))
	case LeaseMiss:
		m.leaseMisses.Inc()
	}
}
