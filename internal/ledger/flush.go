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
	// RecoverAfter is the age past which an org's entry in an in-flight record is read
	// whole by any worker (default: recoverAfter, a tick's deadline and 10 s). Tests
	// shorten it; below a tick's deadline a slow live worker's pop may be read before
	// its drain.
	RecoverAfter time.Duration
	// TracerProvider, when set, makes each flush of Run a "billing.flush" span (the
	// name dashboards know), its Postgres queries under it; nil traces nothing.
	TracerProvider trace.TracerProvider
}

// Flusher persists the live month counters of every org into the ledger at an
// interval: the orgs popped from the dirty-org indexes (those with new usage), their
// counters changed since the last drain (quota's per-org dirty set, popped atomically,
// so no keyspace scan and no cross-slot key) of the current and the previous period,
// drained in one Redis pipeline per batch of orgs and written with one monotonic upsert
// per batch (flushBatchOrgs).
//
// Drained counters that could not be written are not lost: the next tick reads that
// org's period whole (MonthUsage) instead of draining it. A worker killed -9 between a
// pop and its write takes that knowledge with it, but not the pop's entry in the
// index's in-flight record, which is removed only after the write: a Flusher's first
// flush reads whole every org recorded there, and later ticks those recorded for longer
// than recoverAfter (a worker that died while others run). What a dead worker drained
// is therefore persisted by the next worker's first flush, in time proportional to what
// it had in flight, not to the orgs that exist.
//
// Threshold events and the utilization gauge read each org's limits; that work runs
// after every batch is written, within the rest of the tick (afterWork), and what does
// not fit waits for the next tick: durability first, events late but never lost.
type Flusher struct {
	cfg       FlusherConfig
	notifier  *thresholdNotifier
	mu        sync.Mutex
	needsFull map[string]bool              // org|period
	recheck   map[string]bool              // orgs whose limits changed (LimitsChanged): current period read whole next flush
	started   bool                         // a flush has completed: the first one reads the in-flight records whole
	wbSeen    map[string]map[string]string // org -> period -> "epoch:version" of the would-block record last persisted
	idle      atomic.Bool                  // the last flush read and wrote nothing: the next is not traced
	utilAt    time.Time                    // when the visited orgs' utilization was last read from the ledger
	retry     map[string]inflight          // orgs whose last flush failed (with their in-flight entry): visited again next tick
	dedicated []string                     // orgs with a Redis of their own (not indexed), read every DedicatedEvery
	dedAt     time.Time                    // when dedicated was read
	after     afterWork                    // threshold checks and utilization reads left for the end of a tick
	recAt     time.Time                    // when the in-flight records were last read for old entries
}

// inflight is an org's entry in the in-flight record of the index it was popped from.
type inflight struct {
	ix    DirtyIndex
	dirty quota.DirtyOrg
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
	return &Flusher{cfg: cfg, needsFull: map[string]bool{}, recheck: map[string]bool{}, retry: map[string]inflight{}, wbSeen: map[string]map[string]string{},
		after: newAfterWork(),
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
		tick, cancel := context.WithTimeout(ctx, f.tickBudget())
		if _, err := f.traced(tick); err != nil && ctx.Err() == nil {
			f.cfg.Logger.Warn("usage flush incomplete", "err", err.Error())
		}
		cancel()
	}
}

// tickBudget is the deadline of one tick of Run: every drain of a tick starts within
// it after the tick's pop.
func (f *Flusher) tickBudget() time.Duration { return 4*f.cfg.Interval + 5*time.Second }

// recoverAfter is the age past which an entry of an in-flight record is read whole by
// any worker: no live worker's tick drains that long after its pop (tickBudget), so
// the entry's pop either wrote (and a failed removal left it) or its worker died. A
// worker killed mid-flush while others keep running has its drained counters persisted
// by them within recoverAfter and one interval; a worker started again does it in its
// first flush.
func (f *Flusher) recoverAfter() time.Duration {
	if f.cfg.RecoverAfter > 0 {
		return f.cfg.RecoverAfter
	}
	return f.tickBudget() + 10*time.Second
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
	Pending int // threshold checks and utilization reads left for the next tick (afterWork)
	// Recovered is how many orgs came from the in-flight records (read whole).
	Recovered int
	// Persisted is how long the tick took to write what it read: from its start until
	// its last batch ended, before its after-work.
	Persisted time.Duration
	// Draining and Writing are the time its batches spent on their Redis reads and on
	// their Postgres writes, summed over the batches (which run Parallel at once).
	Draining, Writing time.Duration
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
	var popped map[string]inflight
	if indexed {
		recoverAfter := time.Duration(-1) // none: the records are read every recoverAfter/2
		f.mu.Lock()
		switch {
		case first:
			recoverAfter = 0 // every entry: a dead worker's pops are among them
		case start.Sub(f.recAt) >= f.recoverAfter()/2:
			recoverAfter = f.recoverAfter()
		}
		if recoverAfter >= 0 {
			f.recAt = start
		}
		f.mu.Unlock()
		var err error
		if popped, err = f.popDirty(ctx, idx, recoverAfter); err != nil {
			return FlushStats{}, err
		}
	}
	var orgs []tenants.Org
	if !indexed {
		// Every org, read whole the first time (a dead worker's drains).
		cursor := ""
		for {
			page, next, err := f.cfg.Tenants.ListOrgs(ctx, tenants.Page{Limit: 1000, Cursor: cursor})
			if err != nil {
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
			f.giveBack(popped)
			return FlushStats{}, err
		}
	}
	plans := map[string]tenants.Plan{} // by id
	cursor := ""
	for {
		page, next, err := f.cfg.Tenants.ListPlans(ctx, tenants.Page{Limit: 1000, Cursor: cursor})
		if err != nil {
			f.giveBack(popped)
			return FlushStats{}, fmt.Errorf("flush: list plans: %w", err)
		}
		for _, p := range page {
			plans[p.ID] = p
		}
		if cursor = next; cursor == "" {
			break
		}
	}
	now := f.cfg.Clock()
	stats := FlushStats{Dirty: len(popped)}
	var errs []error
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(f.cfg.Parallel)
	for _, batch := range f.prepare(orgs, plans, popped, now, first) {
		g.Go(func() error {
			draining, writing := f.flushBatch(gctx, batch, now)
			mu.Lock()
			defer mu.Unlock()
			stats.Draining += draining
			stats.Writing += writing
			for _, w := range batch {
				stats.Orgs++
				stats.Read += w.read
				stats.Written += w.written
				if w.err != nil {
					errs = append(errs, w.err)
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	stats.Persisted = time.Since(start)
	for _, e := range popped {
		if e.dirty.Recover {
			stats.Recovered++
		}
	}
	f.mu.Lock()
	if first && ctx.Err() == nil {
		// The in-flight records were read whole; an org that failed stays recorded and
		// marked for a whole read.
		f.started = true
	}
	durable := f.utilAt.IsZero() || start.Sub(f.utilAt) >= f.cfg.UtilizationEvery
	if durable {
		f.utilAt = start
	}
	f.mu.Unlock()
	if durable {
		f.after.readUtilization(orgs, first && indexed)
	}
	f.cfg.Metrics.rowsFlushed.Add(float64(stats.Written))
	// Events and utilization in what is left of the tick (at least a tenth of it).
	deadline := start.Add(f.cfg.Interval * 3 / 4)
	if least := time.Now().Add(f.cfg.Interval / 10); deadline.Before(least) {
		deadline = least
	}
	stats.Pending = f.runAfter(ctx, deadline, now)
	f.cfg.Metrics.tick(stats, time.Since(start), f.cfg.Interval)
	if len(errs) > 0 {
		f.cfg.Metrics.flushErrors.Add(float64(len(errs)))
		return stats, errors.Join(errs...)
	}
	f.cfg.Metrics.flushed(start)
	return stats, nil
}

// flushBatchOrgs bounds the orgs of one batch: one Redis pipeline for their drains,
// one transaction for their writes.
const flushBatchOrgs = 500

// orgFlush is one org's part of a tick.
type orgFlush struct {
	org      tenants.Org
	cs       Counters
	pollDone func(error) error // a dedicated Redis's poll (EngineCounters), or nil
	entry    *inflight         // its in-flight entry, when it was popped
	pers     [2]vocab.Period   // the previous and the current period
	full     [2]bool           // read whole
	reads    [2]quota.DrainedPeriod
	read     int
	written  int
	err      error
}

// prepare finds each org's counters and groups the orgs into batches that share them.
func (f *Flusher) prepare(orgs []tenants.Org, plans map[string]tenants.Plan, popped map[string]inflight, now time.Time, first bool) [][]*orgFlush {
	groups := map[any][]*orgFlush{}
	var order []any
	for _, o := range orgs {
		w := &orgFlush{org: o}
		w.pers[1] = vocab.PeriodAt(now, o.BillingAnchorDay)
		w.pers[0] = vocab.PeriodAt(w.pers[1].Start.Add(-time.Nanosecond), o.BillingAnchorDay)
		f.mu.Lock()
		e, ok := popped[o.ID]
		if !ok {
			e, ok = f.retry[o.ID]
		}
		if ok {
			w.entry = &e
		}
		for k, per := range w.pers {
			key := o.ID + "|" + per.ID
			if first || (ok && e.dirty.Recover) { // until read whole, even if this flush cannot reach the org
				f.needsFull[key] = true
			}
			if k == 1 && f.recheck[o.ID] { // its limits changed: every counter judged again, once
				delete(f.recheck, o.ID)
				f.needsFull[key] = true
			}
			w.full[k] = f.needsFull[key]
		}
		f.mu.Unlock()
		cs, err := f.cfg.Counters.CountersFor(o.ID, tenants.RouteOf(o, plans[o.PlanID]))
		if errors.Is(err, quota.ErrAway) {
			// A dedicated Redis in its backoff: not tried now, and said once, when the
			// backoff started, not at every flush. Its periods stay marked for a whole
			// read.
			f.setFull(o.ID+"|"+w.pers[0].ID, true)
			f.setFull(o.ID+"|"+w.pers[1].ID, true)
			continue
		}
		w.cs = cs
		if p, ok := cs.(interface{ PollDone(error) error }); ok {
			w.pollDone = p.PollDone
		}
		var key any = w // counters that cannot drain many periods at once: a batch of one
		if eng := engineOf(cs); eng != nil && err == nil {
			key = eng
		}
		if err != nil {
			w.err = err
		}
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], w)
	}
	var out [][]*orgFlush
	for _, k := range order {
		g := groups[k]
		for i := 0; i < len(g); i += flushBatchOrgs {
			out = append(out, g[i:min(i+flushBatchOrgs, len(g))])
		}
	}
	return out
}

// engineOf is the engine behind counters, whose DrainMany reads a batch at once; nil
// for other counters.
func engineOf(cs Counters) *quota.Engine {
	switch c := cs.(type) {
	case *quota.Engine:
		return c
	case polled:
		return c.Engine
	}
	return nil
}

// flushBatch drains the orgs of one batch, which share their counters, writes what it
// took in one transaction, copies their changed would-block records, and then removes
// the orgs written from the in-flight records. Each org's outcome is in its orgFlush;
// it returns the time it spent on its reads and on its writes.
func (f *Flusher) flushBatch(ctx context.Context, ws []*orgFlush, now time.Time) (draining, writing time.Duration) {
	ready := ws[:0:0]
	for _, w := range ws {
		if w.err == nil {
			ready = append(ready, w)
		} else {
			f.finish(ctx, w)
		}
	}
	if len(ready) == 0 {
		return 0, 0
	}
	start := time.Now()
	f.read(ctx, ready)
	draining = time.Since(start)
	type ref struct {
		w *orgFlush
		k int
	}
	var items []PeriodDrain
	var refs []ref
	for _, w := range ready {
		for k, per := range w.pers {
			d := w.reads[k].Drained
			if len(d.Counters) == 0 && len(d.Reservations) == 0 {
				continue
			}
			items = append(items, PeriodDrain{Org: w.org.ID, Period: per.ID, Day: dayIn(per, now), Drained: d})
			refs = append(refs, ref{w, k})
		}
	}
	start = time.Now()
	raised, err := f.cfg.Store.PersistMany(ctx, items)
	itemErrs := make([]error, len(items))
	if err != nil {
		if len(items) == 1 || ctx.Err() != nil {
			itemErrs[0] = err
			for i := 1; i < len(items); i++ {
				itemErrs[i] = err
			}
		} else { // one by one: one org that cannot be written does not hold back the rest
			raised = make([]int, len(items))
			for i, it := range items {
				r, err := f.cfg.Store.PersistMany(ctx, []PeriodDrain{it})
				if err == nil {
					raised[i] = r[0]
				}
				itemErrs[i] = err
			}
		}
	}
	writing = time.Since(start)
	failed := map[[2]any]bool{}
	for i, r := range refs {
		w, per := r.w, r.w.pers[r.k]
		w.read += len(items[i].Drained.Counters)
		if err := itemErrs[i]; err != nil {
			failed[[2]any{w, r.k}] = true
			// Popped from the dirty set but maybe not stored: read everything next time.
			f.setFull(w.org.ID+"|"+per.ID, true)
			if uerr := w.cs.Undrain(ctx, w.org.ID, items[i].Drained.Reservations); uerr != nil {
				err = errors.Join(err, uerr)
			}
			w.err = errors.Join(w.err, fmt.Errorf("flush %s %s: persist usage: %w", w.org.ID, per.ID, err))
			continue
		}
		if raised != nil {
			w.written += raised[i]
		}
		if len(items[i].Drained.Reservations) > 0 { // opened or settled: in-flight may have moved
			f.observeInFlight(ctx, w.cs, w.org.ID)
		}
		f.after.check(w.org.ID, per.ID, per.End, items[i].Drained.Counters)
	}
	for _, w := range ready {
		for k, per := range w.pers {
			key := w.org.ID + "|" + per.ID
			if rerr := w.reads[k].Err; rerr != nil {
				f.setFull(key, true) // what the read took is written; the rest is read whole next time
				w.err = errors.Join(w.err, fmt.Errorf("flush %s %s: %w", w.org.ID, per.ID, rerr))
			} else if w.full[k] && !failed[[2]any{w, k}] {
				f.setFull(key, false)
			}
		}
		// Would-block records of the same two periods; only those two are remembered.
		seen := map[string]string{}
		for k, per := range w.pers {
			if w.reads[k].Err == nil {
				if err := f.flushWouldBlock(ctx, w.cs, w.org.ID, per.ID, w.reads[k].WouldBlockEpoch, w.reads[k].WouldBlockVersion, seen); err != nil {
					w.err = errors.Join(w.err, err)
				}
			}
		}
		f.mu.Lock()
		f.wbSeen[w.org.ID] = seen
		f.mu.Unlock()
		f.finish(ctx, w)
	}
	f.doneInFlight(ctx, ready)
	return draining, writing
}

// read drains both periods of every org of a batch (one pipeline when the counters are
// an engine's), and reads the periods marked whole after their drain: the drain's At
// comes before both reads, as the ledger's adjustment rule needs.
func (f *Flusher) read(ctx context.Context, ws []*orgFlush) {
	if eng := engineOf(ws[0].cs); eng != nil {
		ps := make([]quota.OrgPeriod, 0, 2*len(ws))
		for _, w := range ws {
			ps = append(ps, quota.OrgPeriod{Org: w.org.ID, Period: w.pers[0].ID}, quota.OrgPeriod{Org: w.org.ID, Period: w.pers[1].ID})
		}
		res := eng.DrainMany(ctx, ps)
		for i, w := range ws {
			w.reads[0], w.reads[1] = res[2*i], res[2*i+1]
		}
	} else {
		for _, w := range ws {
			for k, per := range w.pers {
				r := &w.reads[k]
				r.Drained, r.Err = w.cs.Drain(ctx, w.org.ID, per.ID)
				if r.Err == nil {
					r.WouldBlockEpoch, r.WouldBlockVersion, r.Err = w.cs.WouldBlockVersion(ctx, w.org.ID, per.ID)
				}
			}
		}
	}
	for _, w := range ws {
		for k, per := range w.pers {
			r := &w.reads[k]
			if !w.full[k] || r.Err != nil {
				continue
			}
			all, err := w.cs.MonthUsage(ctx, w.org.ID, per.ID)
			if r.Counters == nil {
				r.Counters = map[quota.Counter]int64{}
			}
			for c, v := range all {
				r.Counters[c] = max(r.Counters[c], v)
			}
			r.Err = err
		}
	}
}

// finish records an org's outcome: visited again next tick when it failed, and its
// dedicated Redis's poll reported.
func (f *Flusher) finish(ctx context.Context, w *orgFlush) {
	if w.pollDone != nil {
		w.err = w.pollDone(w.err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if w.err != nil || ctx.Err() != nil {
		e := inflight{}
		if w.entry != nil {
			e = *w.entry
		}
		f.retry[w.org.ID] = e // its would-block record, say, is not in any index now
	} else {
		delete(f.retry, w.org.ID)
	}
}

// doneInFlight removes the orgs of a batch that were written without an error from the
// in-flight records they were popped into. A removal that fails leaves the entry, read
// whole once it is older than recoverAfter.
func (f *Flusher) doneInFlight(ctx context.Context, ws []*orgFlush) {
	byIndex := map[DirtyIndex][]quota.DirtyOrg{}
	for _, w := range ws {
		if w.err == nil && w.entry != nil && w.entry.ix != nil {
			byIndex[w.entry.ix] = append(byIndex[w.entry.ix], w.entry.dirty)
		}
	}
	for ix, ds := range byIndex {
		if err := ix.DoneInFlight(ctx, ds); err != nil {
			f.cfg.Logger.Warn("in-flight record", "err", err.Error())
		}
	}
}

// popDirty pops every dirty-org index, with the in-flight entries of at least
// recoverAfter. An index that cannot be read keeps its orgs for a later tick; the
// error says which failed, and the orgs popped are returned.
func (f *Flusher) popDirty(ctx context.Context, idx IndexedSource, recoverAfter time.Duration) (map[string]inflight, error) {
	indexes, err := idx.DirtyIndexes()
	out := map[string]inflight{}
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("flush: dirty-org indexes: %w", err))
	}
	for _, ix := range indexes {
		ds, err := ix.PopDirtyOrgs(ctx, recoverAfter)
		if err != nil {
			errs = append(errs, err)
		}
		for _, d := range ds {
			if have, ok := out[d.Org]; ok { // on two indexes: one Redis moved to another
				d.Recover = d.Recover || have.dirty.Recover
			}
			out[d.Org] = inflight{ix: ix, dirty: d}
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
// failed) for the next tick, in memory: the pop took them out of Redis, and their
// in-flight entries stay until they are written.
func (f *Flusher) giveBack(popped map[string]inflight) {
	f.mu.Lock()
	for o, e := range popped {
		f.retry[o] = e
	}
	f.mu.Unlock()
}

// dirtyOrgs returns the orgs an indexed flush visits: those popped, those whose last
// flush failed or that need a whole read, and those with a Redis of their own (listed
// every DedicatedEvery), in one query.
func (f *Flusher) dirtyOrgs(ctx context.Context, start time.Time, popped map[string]inflight) ([]tenants.Org, error) {
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
	for o := range popped {
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
		gone := map[DirtyIndex][]quota.DirtyOrg{}
		f.mu.Lock()
		for _, id := range ids {
			if !found[id] {
				e, ok := popped[id]
				if !ok {
					e = f.retry[id]
				}
				if e.ix != nil {
					gone[e.ix] = append(gone[e.ix], e.dirty)
				}
				delete(f.retry, id)
			}
		}
		f.mu.Unlock()
		for ix, ds := range gone {
			_ = ix.DoneInFlight(ctx, ds) // an entry left is read (as a deleted org: nothing) once old
		}
	}
	return orgs, nil
}

// dayIn is the day whose daily history a flush at now writes for per: today, or the
// period's last day for usage of a period that has ended (counted before its end).
func dayIn(per vocab.Period, now time.Time) time.Time {
	if !now.Before(per.End) {
		return per.End.Add(-time.Nanosecond)
	}
	return now
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
