package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// FlusherConfig configures a Flusher. Store, Tenants and Counters are required.
type FlusherConfig struct {
	Store    *Store
	Tenants  *tenants.Service
	Counters CounterSource
	// Queue enqueues webhook deliveries of threshold events; nil records the events
	// without delivering them. A function, because the River client that implements
	// it is built after the flusher.
	Queue func() webhooks.Enqueuer
	// Interval between flushes (QUOTA_FLUSH_INTERVAL; default 2 s).
	Interval time.Duration
	// Clock picks the periods to flush and the UTC day of the daily history that a
	// flush writes (default time.Now).
	Clock func() time.Time
	// Parallel bounds the orgs flushed at once (default 8).
	Parallel int
	Logger   *slog.Logger
	Metrics  *Metrics
	// CacheOrgs bounds the orgs whose limits are kept for threshold events
	// (QUOTA_CACHE_ORGS; default 10,000).
	CacheOrgs int
	// CacheEvents bounds the threshold events remembered as recorded (default
	// 100,000); one forgotten costs a no-op insert when its counter is flushed again.
	CacheEvents int
	// UtilizationEvery is how often a flush also reads every org's stored usage of the
	// current period from the ledger for quotaplane_worker_month_utilization_ratio
	// (one query per org; default 1 min); the first flush always does. Between those,
	// the gauge follows the counters each flush writes.
	UtilizationEvery time.Duration
	// CacheMetrics counts the flusher's caches: billing_limits and billing_events.
	CacheMetrics *cachemetrics.Metrics
	// DedicatedEvery is how often an indexed flush lists the orgs with a Redis of
	// their own, which it visits every tick (their Redis keep no shared index; default
	// 1 min).
	DedicatedEvery time.Duration
	// TracerProvider, when set, makes each flush of Run a "billing.flush" span (the
	// name dashboards know), its Postgres queries under it; nil traces nothing.
	TracerProvider trace.TracerProvider
}

// Flusher persists the live month counters of every org into the ledger at an
// interval: per org, the counters changed since the last drain (quota's per-org dirty
// set, popped atomically, so no keyspace scan and no cross-slot key) of the current
// and the previous period, written with a monotonic upsert.
//
// Drained counters that could not be written are not lost: the next tick reads that
// org's period whole (MonthUsage) instead of draining it. A worker killed -9 between a
// drain and its write takes that knowledge with it, so a Flusher's first flush reads
// every org's periods whole: what a dead worker drained, and a counter that never
// changes again (a user whose limit is spent) would otherwise never be persisted.
type Flusher struct {
	cfg       FlusherConfig
	notifier  *thresholdNotifier
	mu        sync.Mutex
	needsFull map[string]bool              // org|period
	recheck   map[string]bool              // orgs whose limits changed (LimitsChanged): current period read whole next flush
	started   bool                         // a flush has completed: the first one reads everything
	wbSeen    map[string]map[string]string // org -> period -> "epoch:version" of the would-block record last persisted
	idle      atomic.Bool                  // the last flush read and wrote nothing: the next is not traced
	utilAt    time.Time                    // when every org's utilization was last read from the ledger
	retry     map[string]bool              // orgs whose last flush failed: visited again next tick
	dedicated []string                     // orgs with a Redis of their own (not indexed), read every DedicatedEvery
	dedAt     time.Time                    // when dedicated was read
}

// NewFlusher returns a Flusher; Run it.
func NewFlusher(cfg FlusherConfig) *Flusher {
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.CacheOrgs <= 0 {
		cfg.CacheOrgs = 10_000
	}
	if cfg.UtilizationEvery <= 0 {
		cfg.UtilizationEvery = time.Minute
	}
	if cfg.DedicatedEvery <= 0 {
		cfg.DedicatedEvery = time.Minute
	}
	if cfg.CacheEvents <= 0 {
		cfg.CacheEvents = 100_000
	}
	seen, _ := lru.New[string, struct{}](cfg.CacheEvents)
	return &Flusher{cfg: cfg, needsFull: map[string]bool{}, recheck: map[string]bool{}, retry: map[string]bool{}, wbSeen: map[string]map[string]string{},
		notifier: &thresholdNotifier{store: cfg.Store, queue: cfg.Queue, seen: seen, mSeen: cfg.CacheMetrics.For("billing_events"), util: cfg.Metrics.util,
			limits: newLimitCache(cfg.Tenants, 10*time.Second, cfg.CacheOrgs, cfg.CacheMetrics.For("billing_limits"))}}
}

// Run flushes every Interval until ctx ends, then once more (with a fresh deadline)
// so a clean shutdown loses nothing.
func (f *Flusher) Run(ctx context.Context) {
	t := time.NewTicker(f.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if _, err := f.traced(final); err != nil {
				f.cfg.Logger.Warn("final usage flush failed", "err", err.Error())
			}
			cancel()
			return
		case <-t.C:
		}
		budget := 4*f.cfg.Interval + 5*time.Second
		f.mu.Lock()
		if !f.started {
			// The first flush reads every org whole: ~1 min at 100,000 orgs (make scale),
			// and cut off by the tick's deadline it would start again from the top
			// forever. Later ticks visit only the orgs that changed.
			budget = max(budget, 15*time.Minute)
		}
		f.mu.Unlock()
		tick, cancel := context.WithTimeout(ctx, budget)
		if _, err := f.traced(tick); err != nil && ctx.Err() == nil {
			f.cfg.Logger.Warn("usage flush incomplete", "err", err.Error())
		}
		cancel()
	}
}

// untraced marks a context's work as not sampled: under the parent-based samplers
// (the default), its queries start no trace of their own.
var untraced = trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}})

// traced is FlushOnce in a span of its own when tracing is on. A flush after an idle
// one (it read and wrote nothing, without an error) runs untraced, so an idle worker
// exports nothing; when it finds work after all, its span is recorded afterwards,
// without its queries' spans. Under steady traffic every flush is traced whole.
func (f *Flusher) traced(ctx context.Context) (FlushStats, error) {
	if f.cfg.TracerProvider == nil {
		return f.FlushOnce(ctx)
	}
	tracer := f.cfg.TracerProvider.Tracer("github.com/quotaplane/quotaplane/internal/ledger")
	if f.idle.Load() {
		start := time.Now()
		st, err := f.FlushOnce(trace.ContextWithSpanContext(ctx, untraced))
		if !f.noteIdle(st, err) {
			_, span := tracer.Start(ctx, "billing.flush", trace.WithTimestamp(start))
			flushSpan(span, st, err)
		}
		return st, err
	}
	ctx, span := tracer.Start(ctx, "billing.flush")
	st, err := f.FlushOnce(ctx)
	f.noteIdle(st, err)
	flushSpan(span, st, err)
	return st, err
}

// noteIdle records whether a flush was idle, and returns it.
func (f *Flusher) noteIdle(st FlushStats, err error) bool {
	idle := err == nil && st.Read == 0 && st.Written == 0
	f.idle.Store(idle)
	return idle
}

// flushSpan describes a flush on its span and ends it.
func flushSpan(span trace.Span, st FlushStats, err error) {
	span.SetAttributes(attribute.Int("quotaplane.flush.orgs", st.Orgs), attribute.Int("quotaplane.flush.read", st.Read),
		attribute.Int("quotaplane.flush.written", st.Written))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "flush incomplete")
	}
	span.End()
}

// FlushStats says what one flush did.
type FlushStats struct {
	Orgs    int // orgs visited
	Dirty   int // orgs popped from the dirty-org indexes
	Read    int // counters read from Redis
	Written int // stored values raised
}

// FlushOnce persists the changed counters of every org once. Errors of single orgs
// are joined; the other orgs are flushed regardless. Every failed flush counts in
// quotaplane_worker_flush_errors_total: one per failed org, or one when the orgs or
// plans could not be listed (Postgres down: before, that returned uncounted, and
// QuotaplaneFlushFailing never moved through a database outage).
func (f *Flusher) FlushOnce(ctx context.Context) (FlushStats, error) {
	st, err := f.flushOnce(ctx)
	if err != nil && st.Orgs == 0 && ctx.Err() == nil { // else counted per failed org
		f.cfg.Metrics.flushErrors.Inc()
	}
	return st, err
}

func (f *Flusher) flushOnce(ctx context.Context) (FlushStats, error) {
	start := time.Now()
	f.mu.Lock()
	first := !f.started
	f.mu.Unlock()
	// The indexes first: an org that changes after its pop is in the index again for
	// the next tick, and one popped is visited by this one (or given back).
	idx, indexed := f.cfg.Counters.(IndexedSource)
	var popped []string
	if indexed {
		var err error
		if popped, err = f.popDirty(ctx, idx); err != nil {
			return FlushStats{}, err
		}
	}
	var orgs []tenants.Org
	if first || !indexed {
		// Every org, read whole the first time (a dead worker's drains).
		cursor := ""
		for {
			page, next, err := f.cfg.Tenants.ListOrgs(ctx, tenants.Page{Limit: 1000, Cursor: cursor})
			if err != nil {
				f.giveBack(idx, popped)
				return FlushStats{}, fmt.Errorf("flush: list orgs: %w", err)
			}
			orgs = append(orgs, page...)
			if cursor = next; cursor == "" {
				break
			}
		}
	} else {
		var err error
		if orgs, err = f.dirtyOrgs(ctx, start, popped); err != nil {
			f.giveBack(idx, popped)
			return FlushStats{}, err
		}
	}
	plans := map[string]tenants.Plan{} // by id
	cursor := ""
	for {
		page, next, err := f.cfg.Tenants.ListPlans(ctx, tenants.Page{Limit: 1000, Cursor: cursor})
		if err != nil {
			f.giveBack(idx, popped)
			return FlushStats{}, fmt.Errorf("flush: list plans: %w", err)
		}
		for _, p := range page {
			plans[p.ID] = p
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	var mu sync.Mutex
	stats := FlushStats{Dirty: len(popped)}
	var errs []error
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(f.cfg.Parallel)
	now := f.cfg.Clock()
	f.mu.Lock()
	durable := f.utilAt.IsZero() || start.Sub(f.utilAt) >= f.cfg.UtilizationEvery
	f.mu.Unlock()
	var utilFailed atomic.Bool
	for _, o := range orgs {
		g.Go(func() error {
			if durable && !f.storedUtilization(gctx, o, now) {
				utilFailed.Store(true)
			}
			read, written, err := f.flushOrg(gctx, o, plans[o.PlanID], now, first)
			f.mu.Lock()
			if err != nil || gctx.Err() != nil {
				f.retry[o.ID] = true // its would-block record, say, is not in any index now
			} else {
				delete(f.retry, o.ID)
			}
			f.mu.Unlock()
			mu.Lock()
			stats.Orgs++
			stats.Read += read
			stats.Written += written
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	if durable && !utilFailed.Load() && ctx.Err() == nil {
		f.mu.Lock()
		f.utilAt = start
		f.mu.Unlock()
	}
	if first && ctx.Err() == nil {
		// Every org was read whole; one that failed is marked for a whole read again.
		f.mu.Lock()
		f.started = true
		f.mu.Unlock()
	}
	f.cfg.Metrics.rowsFlushed.Add(float64(stats.Written))
	f.cfg.Metrics.tick(stats, time.Since(start), f.cfg.Interval)
	if len(errs) > 0 {
		f.cfg.Metrics.flushErrors.Add(float64(len(errs)))
		return stats, errors.Join(errs...)
	}
	f.cfg.Metrics.flushed(start)
	return stats, nil
}

// popDirty pops every dirty-org index. An index that cannot be read keeps its orgs
// for a later tick; the error says which failed, and the orgs popped are returned.
func (f *Flusher) popDirty(ctx context.Context, idx IndexedSource) ([]string, error) {
	indexes, err := idx.DirtyIndexes()
	var out []string
	seen := map[string]bool{}
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("flush: dirty-org indexes: %w", err))
	}
	for _, ix := range indexes {
		ids, err := ix.PopDirtyOrgs(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				out = append(out, id)
			}
		}
	}
	if len(errs) > 0 && len(out) == 0 {
		return nil, errors.Join(errs...)
	}
	if len(errs) > 0 {
		f.cfg.Logger.Warn("dirty-org index", "err", errors.Join(errs...).Error())
		f.cfg.Metrics.flushErrors.Inc()
	}
	return out, nil
}

// giveBack keeps the orgs popped by a flush that could not visit them (Postgres
// failed) for the next tick, in memory: the pop took them out of Redis.
func (f *Flusher) giveBack(idx IndexedSource, orgs []string) {
	if idx == nil || len(orgs) == 0 {
		return
	}
	f.mu.Lock()
	for _, o := range orgs {
		f.retry[o] = true
	}
	f.mu.Unlock()
}

// dirtyOrgs returns the orgs an indexed flush visits: those popped, those whose last
// flush failed or that need a whole read, and those with a Redis of their own (listed
// every DedicatedEvery), in one query.
func (f *Flusher) dirtyOrgs(ctx context.Context, start time.Time, popped []string) ([]tenants.Org, error) {
	f.mu.Lock()
	refresh := f.dedAt.IsZero() || start.Sub(f.dedAt) >= f.cfg.DedicatedEvery
	f.mu.Unlock()
	if refresh {
		ded, err := f.cfg.Tenants.DedicatedOrgs(ctx)
		if err != nil {
			return nil, fmt.Errorf("flush: list orgs with their own redis: %w", err)
		}
		ids := make([]string, len(ded))
		for i, o := range ded {
			ids[i] = o.ID
		}
		f.mu.Lock()
		f.dedicated, f.dedAt = ids, start
		f.mu.Unlock()
	}
	want := map[string]bool{}
	for _, o := range popped {
		want[o] = true
	}
	f.mu.Lock()
	for _, o := range f.dedicated {
		want[o] = true
	}
	for o := range f.retry {
		want[o] = true
	}
	for k := range f.needsFull {
		org, _, _ := strings.Cut(k, "|")
		want[org] = true
	}
	for o := range f.recheck {
		want[o] = true
	}
	f.mu.Unlock()
	if len(want) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(want))
	for o := range want {
		ids = append(ids, o)
	}
	orgs, err := f.cfg.Tenants.OrgRoutes(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("flush: read dirty orgs: %w", err)
	}
	if len(orgs) < len(ids) { // deleted orgs: nothing to keep for them
		found := map[string]bool{}
		for _, o := range orgs {
			found[o.ID] = true
		}
		f.mu.Lock()
		for _, id := range ids {
			if !found[id] {
				delete(f.retry, id)
			}
		}
		f.mu.Unlock()
	}
	return orgs, nil
}

func (f *Flusher) flushOrg(ctx context.Context, o tenants.Org, plan tenants.Plan, now time.Time, first bool) (read, written int, err error) {
	cur := vocab.PeriodAt(now, o.BillingAnchorDay)
	prev := vocab.PeriodAt(cur.Start.Add(-time.Nanosecond), o.BillingAnchorDay)
	if first { // until read whole, even if this flush cannot reach the org
		f.setFull(o.ID+"|"+prev.ID, true)
		f.setFull(o.ID+"|"+cur.ID, true)
	}
	f.mu.Lock()
	if f.recheck[o.ID] { // its limits changed: every counter judged again, once
		delete(f.recheck, o.ID)
		f.needsFull[o.ID+"|"+cur.ID] = true
	}
	f.mu.Unlock()
	cs, err := f.cfg.Counters.CountersFor(o.ID, tenants.RouteOf(o, plan))
	if errors.Is(err, quota.ErrAway) {
		// A dedicated Redis in its backoff: not tried now, and said once, when the
		// backoff started, not at every flush. Its periods stay marked for a whole
		// read.
		f.setFull(o.ID+"|"+prev.ID, true)
		f.setFull(o.ID+"|"+cur.ID, true)
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, err
	}
	if p, ok := cs.(interface{ PollDone(error) error }); ok {
		defer func() { err = p.PollDone(err) }()
	}
	var errs []error
	for _, per := range []vocab.Period{prev, cur} {
		r, w, err := f.flushPeriod(ctx, cs, o.ID, per, dayIn(per, now))
		read += r
		written += w
		if err != nil {
			errs = append(errs, err)
		}
	}
	// Would-block records of the same two periods; only those two are remembered.
	seen := map[string]string{}
	for _, per := range []vocab.Period{prev, cur} {
		if err := f.flushWouldBlock(ctx, cs, o.ID, per.ID, seen); err != nil {
			errs = append(errs, err)
		}
	}
	f.mu.Lock()
	f.wbSeen[o.ID] = seen
	f.mu.Unlock()
	return read, written, errors.Join(errs...)
}

// storedUtilization records, for quotaplane_worker_month_utilization_ratio, each
// stored counter of org's current period against its month limit: durable data, so
// an org at 100 % whose counters no longer change (only denials), or that Redis lost,
// is exported by a worker that has just started. It reports whether it could read
// them; a failure is logged (the flush itself counts its own errors).
func (f *Flusher) storedUtilization(ctx context.Context, o tenants.Org, now time.Time) bool {
	cur := vocab.PeriodAt(now, o.BillingAnchorDay)
	used, err := f.cfg.Store.Usage(ctx, o.ID, cur.ID)
	if err == nil && len(used) > 0 {
		var l *Limits
		if l, err = f.notifier.limits.get(ctx, o.ID); err == nil {
			for c, v := range used {
				if limit, ok := l.Month(c); ok && limit > 0 {
					f.notifier.util.observe(o.ID, cur.ID, cur.End, string(c.Level), c.Metric, float64(v)/float64(limit))
				}
			}
		}
	}
	if err != nil {
		f.cfg.Logger.Warn("month utilization from the ledger", "org", o.ID, "err", err.Error())
		return false
	}
	return true
}

// dayIn is the day whose daily history a flush at now writes for per: today, or the
// period's last day for usage of a period that has ended (counted before its end).
func dayIn(per vocab.Period, now time.Time) time.Time {
	if !now.Before(per.End) {
		return per.End.Add(-time.Nanosecond)
	}
	return now
}

func (f *Flusher) flushPeriod(ctx context.Context, cs Counters, org string, per vocab.Period, day time.Time) (int, int, error) {
	period := per.ID
	key := org + "|" + period
	f.mu.Lock()
	full := f.needsFull[key]
	f.mu.Unlock()
	var d quota.Drained
	var readErr error
	if full {
		// Every counter, and the reservations changed since the last drain (those
		// of a failed persist were given back to the next drain). The drain first:
		// its At comes before both reads, as the ledger's adjustment rule needs.
		d, readErr = cs.Drain(ctx, org, period)
		if readErr == nil {
			var all map[quota.Counter]int64
			all, readErr = cs.MonthUsage(ctx, org, period)
			for c, v := range all {
				d.Counters[c] = max(d.Counters[c], v)
			}
		}
	} else {
		d, readErr = cs.Drain(ctx, org, period)
	}
	counters := d.Counters
	if len(counters) == 0 && len(d.Reservations) == 0 {
		if readErr != nil {
			return 0, 0, fmt.Errorf("flush %s %s: %w", org, period, readErr)
		}
		if full {
			f.setFull(key, false)
		}
		return 0, 0, nil
	}
	written, err := f.cfg.Store.PersistDrained(ctx, org, period, day, d)
	if err != nil || readErr != nil {
		// Popped from the dirty set but maybe not stored: read everything next time.
		f.setFull(key, true)
		if err != nil {
			if uerr := cs.Undrain(ctx, org, d.Reservations); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}
		return len(counters), written, errors.Join(err, readErr)
	}
	if full {
		f.setFull(key, false)
	}
	if len(d.Reservations) > 0 { // opened or settled: in-flight may have moved
		f.observeInFlight(ctx, cs, org)
	}
	if err := f.notifier.check(ctx, org, period, per.End, counters); err != nil {
		f.cfg.Logger.Warn("threshold events", "org", org, "period", period, "err", err.Error())
	}
	return len(counters), written, nil
}

// LimitsChanged tells the flusher that the limits of orgIDs changed (an api replica
// announced it on the invalidation channel: tenants.Subscribe). Their cached limits
// are dropped, and at the next flush every counter of their current period is judged
// against the new limits, not only those that moved since: a counter that crossed a
// threshold of a limit lowered just before (or whose limit the cache did not know
// yet) raises its event then, at most one flush interval after the announcement.
func (f *Flusher) LimitsChanged(orgIDs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, o := range orgIDs {
		f.notifier.limits.entries.Remove(o)
		f.recheck[o] = true
	}
}

// AllLimitsChanged drops every cached limit, for a (re)subscription to the
// invalidation channel, which may have missed announcements: each org's limits are
// read again at its next flush.
func (f *Flusher) AllLimitsChanged() { f.notifier.limits.entries.Purge() }

func (f *Flusher) setFull(key string, v bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v {
		f.needsFull[key] = true
	} else {
		delete(f.needsFull, key)
	}
}

// observeInFlight reads org's in-flight units (concurrency limits) for
// quotaplane_worker_in_flight_units, when the counters can say (quota.Engine.InFlight).
// A failed read leaves the last reading.
func (f *Flusher) observeInFlight(ctx context.Context, cs Counters, org string) {
	r, ok := cs.(interface {
		InFlight(ctx context.Context, org string) (map[quota.Counter]int64, error)
	})
	if !ok || f.cfg.Metrics == nil {
		return
	}
	if m, err := r.InFlight(ctx, org); err == nil {
		f.cfg.Metrics.inFlight.set(org, m)
	}
}
