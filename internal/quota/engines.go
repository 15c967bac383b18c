package quota

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/redact"
	"github.com/quotaplane/quotaplane/internal/platform/redisconn"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// ErrOverloaded is returned by the Engines when an org already has
// EnginesConfig.MaxInFlightPerOrg checks in flight. Nothing was decided or counted;
// the HTTP layer answers 429 or 503 with a short Retry-After.
var ErrOverloaded = derrors.New(derrors.Overloaded, "quota: too many checks in flight for this org")

// DefaultPool is the name of the pool of EnginesConfig.DefaultURL, and
// DedicatedPool the name under which every org's dedicated Redis is reported (in
// Outcome.Pool and in metrics: the pool label never names an org).
const (
	DefaultPool   = "default"
	DedicatedPool = "dedicated"
)

// Outcome says how a check was answered.
type Outcome struct {
	// Degraded is true when the route's fail mode answered instead of Redis (or, for
	// FailClosed, refused to). Every degraded answer must say so to the client.
	Degraded bool
	// Pool is the name of the pool that served (or failed) the check: DefaultPool, a
	// pool class, or DedicatedPool. Empty when the check never reached a pool.
	Pool string
}

// EnginesConfig configures an Engines.
type EnginesConfig struct {
	// DefaultURL is the Redis of the default pool; required unless Pools has "default".
	DefaultURL string
	// Pools maps a pool class to its Redis URL (QUOTA_REDIS_POOLS, read by
	// config.ParsePools).
	Pools map[string]string
	// PoolSize is the connection pool size of each Redis client (0: go-redis's default).
	PoolSize int
	// MaxInFlightPerOrg bounds the checks of one org in flight on this replica, so one
	// noisy tenant cannot take every connection and queue slot (default 256).
	MaxInFlightPerOrg int
	// Replicas is the number of API replicas; FailLocal gives this replica
	// limit / Replicas of each limit (default 1).
	Replicas int
	// RedisTimeout is the dial, read and write timeout of the engines' clients, so a
	// dead Redis is noticed fast (default 100 ms).
	RedisTimeout time.Duration
	// Breaker tunes the circuit breaker of each Redis.
	Breaker BreakerConfig
	// PollBackoff spaces background polls (SweepReservations, PollEngine) of a
	// dedicated Redis that fails.
	PollBackoff PollBackoff
	// Engine is the configuration of every engine (KeyPrefix, Hydrator, Clock...).
	Engine Config
	// Registerer receives the router's metrics; nil registers none.
	Registerer prometheus.Registerer
	// MetricsOrgs bounds the org label of quotaplane_org_checks_total: at most
	// MetricsOrgs orgs have a series of their own on this replica, the others are
	// counted as org "_other" (QUOTA_METRICS_ORGS; default 100; negative: none). The
	// first orgs checked take the free labels; after that, every MetricsOrgsWindow the
	// busiest orgs of "_other" take the labels of the quietest named orgs
	// (orgLabels, in metrics.go).
	MetricsOrgs int
	// MetricsOrgsWindow is the window over which org volumes are compared for the
	// org labels (default 1 minute).
	MetricsOrgsWindow time.Duration
}

// Engines holds the engine of every pool (and of every dedicated Redis) and sends
// each check to the engine of its org's Redis, bounds each org's
// checks in flight, trips a circuit breaker per Redis, and applies the plan's fail
// mode while a Redis is unavailable. It is safe for concurrent use.
//
// Engines and their clients are created on first use, once per URL; the hot path
// then only reads a sync.Map. Every dedicated Redis gets its own engine and breaker
// but is reported as pool DedicatedPool.
//
// Degraded answers (Outcome.Degraded) by fail mode: FailOpen allows with usage
// unknown (Used 0, Remaining = Limit); FailClosed returns an error wrapping
// ErrUnavailable; FailLocal decides with an in-process limiter whose Levels report
// this replica's share as Limit and the locally counted usage as Used (see
// localLimiter for what it cannot know).
type Engines struct {
	cfg        EnginesConfig
	defaultURL string
	names      map[string]string // configured URL -> pool name
	classes    map[string]string // pool class -> URL

	backends sync.Map  // URL -> *backendEntry
	inflight *orgSlots // each org's checks in flight, against MaxInFlightPerOrg

	local   *localLimiter
	caps    *capacities
	metrics *enginesMetrics
	tracer  trace.Tracer // nil when tracing is off

	mu     sync.Mutex // orders backend creation against Close
	closed bool
	open   []*backend
}

// NewEngines validates cfg and returns the engines; no Redis is contacted until the
// first check for it. Errors wrap ErrInvalid.
func NewEngines(cfg EnginesConfig) (*Engines, error) {
	if cfg.MaxInFlightPerOrg <= 0 {
		cfg.MaxInFlightPerOrg = 256
	}
	if cfg.MetricsOrgs == 0 {
		cfg.MetricsOrgs = 100
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.RedisTimeout <= 0 {
		cfg.RedisTimeout = 100 * time.Millisecond
	}
	cfg.Breaker.setDefaults()
	cfg.PollBackoff.setDefaults()
	if cfg.Engine.RetryBudget <= 0 {
		cfg.Engine.RetryBudget = 3 * cfg.RedisTimeout
	}
	if err := cfg.Engine.setDefaults(); err != nil {
		return nil, err
	}
	r := &Engines{
		cfg:      cfg,
		names:    map[string]string{},
		classes:  map[string]string{},
		local:    newLocalLimiter(cfg.Replicas),
		tracer:   newTracer(cfg.Engine.TracerProvider),
		inflight: newOrgSlots(cfg.MaxInFlightPerOrg),
	}
	r.defaultURL = cfg.DefaultURL
	if r.defaultURL == "" {
		r.defaultURL = cfg.Pools[DefaultPool]
	}
	if r.defaultURL == "" {
		return nil, fmt.Errorf("%w: quota router: no default redis url", ErrInvalid)
	}
	urls := map[string][]string{r.defaultURL: {DefaultPool}}
	for class, u := range cfg.Pools {
		if !vocab.ValidID(class) || class == DedicatedPool {
			return nil, fmt.Errorf("%w: quota router: pool class %q is not a valid id or is reserved", ErrInvalid, class)
		}
		if _, err := redisconn.Parse(u, false); err != nil {
			return nil, fmt.Errorf("%w: quota router: pool %q: redis url %s: %s", ErrInvalid, class, redact.URL(u), redact.Error(err, u))
		}
		r.classes[class] = u
		if class != DefaultPool {
			urls[u] = append(urls[u], class)
		}
	}
	if _, err := redisconn.Parse(r.defaultURL, false); err != nil {
		return nil, fmt.Errorf("%w: quota router: default pool: redis url %s: %s", ErrInvalid, redact.URL(r.defaultURL), redact.Error(err, r.defaultURL))
	}
	for u, names := range urls {
		if names[0] == DefaultPool {
			r.names[u] = DefaultPool // classes sharing the default Redis are the default pool
			continue
		}
		slices.Sort(names)
		r.names[u] = strings.Join(names, ",")
	}
	m, err := newEnginesMetrics(r, cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("quota router: metrics: %w", err)
	}
	r.metrics = m
	r.caps = newCapacities(r)
	return r, nil
}

// Close stops every engine and closes its client. Checks afterwards fail with ErrClosed.
func (r *Engines) Close() error {
	r.mu.Lock()
	r.closed = true
	open := r.open
	r.open = nil
	r.mu.Unlock()
	var errs []error
	for _, b := range open {
		errs = append(errs, b.eng.Close(), b.rdb.Close())
	}
	return errors.Join(errs...)
}

// PoolStates returns the breaker state ("closed", "half-open" or "open") of every
// pool used so far, the worst one for DedicatedPool; for readiness checks and tests.
func (r *Engines) PoolStates() map[string]string {
	worst := map[string]gobreaker.State{}
	r.backends.Range(func(_, v any) bool {
		if b := v.(*backendEntry).ready(); b != nil {
			if s, ok := worst[b.name]; !ok || b.state() > s {
				worst[b.name] = b.state()
			}
		}
		return true
	})
	out := make(map[string]string, len(worst))
	for name, s := range worst {
		out[name] = s.String()
	}
	return out
}

// urlOf maps a route to its Redis URL.
func (r *Engines) urlOf(route *vocab.Route) string {
	if route.RedisURL != "" {
		return route.RedisURL
	}
	if u, ok := r.classes[route.Pool]; ok {
		return u
	}
	return r.defaultURL
}

// EngineFor returns the engine holding the counters of route's org, opened on first
// use: the mapping Check uses, for readers of live counters (usage, the worker).
func (r *Engines) EngineFor(route vocab.Route) (*Engine, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return nil, err
	}
	return b.eng, nil
}

// Now is the clock route's checks are decided on (Engine.Now of its Redis's engine):
// Redis time on the monotonic clock, for what a caller decides around a check (a
// throttle's expiry, the seconds until a reset). When the engine cannot be opened, the
// engines' local clock (Config.Clock).
func (r *Engines) Now(route vocab.Route) time.Time {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return r.cfg.Engine.now()
	}
	return b.eng.Now()
}

// DefaultNow is the default pool's engine clock (Now of the zero Route), for the
// time-dependent decisions made outside a check: a grant's lapse, the current period
// of the usage API, the periods the worker flushes and closes. Pass it where a
// func() time.Time clock is taken.
func (r *Engines) DefaultNow() time.Time { return r.Now(vocab.Route{}) }

func validateRoute(route *vocab.Route, req *Request) error {
	err := req.Validate()
	if route.FailMode != "" && !route.FailMode.Valid() {
		err = errors.Join(err, fmt.Errorf("%w: fail mode %q is not open, closed or local", ErrInvalid, route.FailMode))
	}
	return err
}

// Check decides req on the Redis of route, or by route's fail mode when that Redis
// is unavailable: Decide of a batch of one. Its errors are Decide's.
func (r *Engines) Check(ctx context.Context, route vocab.Route, req Request) (vocab.Result, Outcome, error) {
	cs := [1]Check{{Route: route, Request: req}}
	r.Decide(ctx, cs[:])
	return cs[0].Result, cs[0].Outcome, cs[0].Err
}

// answer is a check's answer from the engine of pool, or by route's fail mode when
// that Redis was unavailable or its breaker refused the check (out is then marked
// degraded).
func (r *Engines) answer(route *vocab.Route, req *Request, pool string, res vocab.Result, err error, out *Outcome) (vocab.Result, error) {
	if err == nil {
		r.metrics.atBound(pool, &res)
		return res, nil
	}
	bad := errors.Is(err, ErrBadReply)
	if bad {
		r.metrics.replyError(pool)
	}
	r.metrics.boundRefusal(err)
	if !bad && !errors.Is(err, ErrUnavailable) && !isBreakerRejection(err) {
		return res, err
	}
	out.Degraded = true
	return r.degrade(route, req, pool, err)
}

// degrade answers req by route's fail mode; cause is why Redis did not.
func (r *Engines) degrade(route *vocab.Route, req *Request, pool string, cause error) (vocab.Result, error) {
	switch route.FailMode {
	case vocab.FailOpen:
		return openResult(req, r.Now(*route)), nil
	case vocab.FailLocal: // the engine's clock runs on from its last sample while Redis is away
		return r.local.decide(req, r.Now(*route)), nil
	}
	if errors.Is(cause, ErrUnavailable) || errors.Is(cause, ErrBadReply) {
		return vocab.Result{}, fmt.Errorf("pool %s: %w", pool, cause)
	}
	return vocab.Result{}, unavailable(req.Org, pool, cause)
}

// Check is one check of a batch given to Decide: what is asked (Route, Request) and,
// once decided, its answer (Result, Outcome, Err).
type Check struct {
	Route   vocab.Route
	Request Request
	Result  vocab.Result
	Outcome Outcome
	Err     error
}

// Decide decides every check of cs in place, each on its own, on the Redis of its
// route or by the route's fail mode when that Redis is unavailable: a single check is
// a batch of one. Checks bound for the same Redis (on a cluster, the same primary) go
// together behind one breaker decision: a single check through the engine's batching
// loop, where it shares a pipeline with concurrent callers' checks, several as one
// pipeline of their own (Engine.run). Different Redis are asked concurrently.
//
// Errors (Check.Err): ErrInvalid for a bad request or route; ErrOverloaded when the
// org has too many checks in flight (nothing counted); ErrUnavailable when Redis
// cannot answer and the fail mode is FailClosed (Outcome.Degraded is true);
// ErrNotHydrated, ErrIdempotencyConflict, *BoundError, ErrClosed and context errors as
// Engine.Check.
func (r *Engines) Decide(ctx context.Context, cs []Check) {
	start := time.Now()
	var span trace.Span
	if r.tracer != nil {
		ctx, span = startDecide(r.tracer, ctx, cs)
	}
	r.decide(ctx, cs)
	if span != nil {
		endDecide(span, cs)
	}
	for i := range cs {
		c := &cs[i]
		r.metrics.observe(c.Outcome.Pool, &c.Route, &c.Request, &c.Result, c.Err, c.Outcome.Degraded, start)
	}
}

// lane is the checks of a batch bound for one Redis: one breaker's.
type lane struct {
	b     *backend
	cb    *breaker
	items []*Check
}

// decide is Decide without its span and metrics: it validates each check once, takes
// its org's in-flight slot for the whole batch, and sends each Redis its lane (send).
func (r *Engines) decide(ctx context.Context, cs []Check) {
	// A single check's scratch is on the stack; a batch's is allocated once. slots
	// are the orgs whose in-flight slots were taken, given back at the end.
	var oneSlot [1]string
	var oneItem [1]*Check
	slots, items := oneSlot[:0], oneItem[:0]
	if len(cs) > 1 {
		slots, items = make([]string, 0, len(cs)), make([]*Check, 0, len(cs))
	}
	defer func() {
		for _, org := range slots {
			r.inflight.release(org)
		}
	}()
	var first lane  // the lane of the first check routed, its items in items
	var more []lane // every lane, first's included, once a second Redis is named
	var caps *capacityDraws
	defer func() {
		if caps != nil {
			caps.settle(r, cs)
		}
	}()
	for i := range cs {
		c := &cs[i]
		c.Result, c.Outcome = vocab.Result{}, Outcome{}
		if c.Err = validateRoute(&c.Route, &c.Request); c.Err != nil {
			continue
		}
		if !r.inflight.acquire(c.Request.Org) {
			c.Err = fmt.Errorf("quota check %s: %w", c.Request.Org, ErrOverloaded)
			continue
		}
		slots = append(slots, c.Request.Org)
		if len(c.Request.Capacities) > 0 {
			if caps == nil {
				caps = &capacityDraws{}
			}
			if !caps.draw(ctx, r, cs, i) {
				continue // answered by its capacities
			}
		}
		b, err := r.backendFor(r.urlOf(&c.Route))
		if err != nil {
			c.Err = err
			continue
		}
		c.Outcome.Pool = b.name
		cb := b.breakerFor(c.Request.Org)
		switch {
		case more == nil && (first.cb == nil || cb == first.cb):
			first.b, first.cb = b, cb
			items = append(items, c)
		case more == nil:
			more = []lane{{b: first.b, cb: first.cb, items: slices.Clone(items)}, {b: b, cb: cb, items: []*Check{c}}}
		default:
			k := slices.IndexFunc(more, func(l lane) bool { return l.cb == cb })
			if k < 0 {
				more = append(more, lane{b: b, cb: cb})
				k = len(more) - 1
			}
			more[k].items = append(more[k].items, c)
		}
	}
	if more == nil {
		if len(items) > 0 {
			r.send(ctx, first.b, first.cb, items)
		}
		return
	}
	var wg sync.WaitGroup
	for k := 1; k < len(more); k++ {
		l := &more[k]
		wg.Go(func() { r.send(ctx, l.b, l.cb, l.items) })
	}
	r.send(ctx, more[0].b, more[0].cb, more[0].items)
	wg.Wait()
}

// send decides items on the engine of b behind one decision of b's breaker cb, and
// answers each (answer).
func (r *Engines) send(ctx context.Context, b *backend, cb *breaker, items []*Check) {
	b.inflight.Add(int64(len(items)))
	defer b.inflight.Add(-int64(len(items)))
	done, err := cb.Allow()
	if err == nil {
		b.eng.decide(ctx, items) // validated by decide
		done(verdict(items))
	} else {
		for _, c := range items {
			c.Err = err
		}
	}
	for _, c := range items {
		c.Result, c.Err = r.answer(&c.Route, &c.Request, b.name, c.Result, c.Err, &c.Outcome)
	}
}

// verdict is what a batch told its breaker of Redis: its first Redis failure (a
// failure); else, when every check ended with its caller gone or the engine closed
// (errors the breaker leaves out: newBreaker), the first of those, since nothing was
// learnt; else nil (a success). For a single check, its error.
func verdict(items []*Check) error {
	var gone error
	for _, c := range items {
		if isRedisFailure(c.Err) {
			return c.Err
		}
	}
	for _, c := range items {
		if !isExcluded(c.Err) {
			return nil
		}
		if gone == nil {
			gone = c.Err
		}
	}
	return gone
}

// Reserve holds req.Cost units on the Redis of route (Engine.Reserve), drawing them
// first on req.Capacities as a check does, all or nothing: a capacity's refusal is the
// reservation's (Result.BlockedAt names it; in Shadow or Warn mode it is told in
// Result.WouldBlock), and a reservation not made gives its draws back. Its settling
// does not reach the capacities: what a commit or release gives back stays counted
// there until it leaves the window, and what a commit counts past the amount is not
// drawn. A reservation has no fail mode: without Redis nothing can be held, so it
// fails with an error wrapping ErrUnavailable whatever the plan's fail mode, the
// capacities' Redis included.
//
// Errors: those of Engine.Reserve, and ErrOverloaded as Check.
func (r *Engines) Reserve(ctx context.Context, route vocab.Route, req Request, opt ReserveOptions) (vocab.Reservation, vocab.Result, error) {
	if !r.inflight.acquire(req.Org) {
		return vocab.Reservation{}, vocab.Result{}, fmt.Errorf("quota reserve %s: %w", req.Org, ErrOverloaded)
	}
	defer r.inflight.release(req.Org)
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return vocab.Reservation{}, vocab.Result{}, err
	}
	var taken []drawn
	var would *vocab.Blocked
	if len(req.Capacities) > 0 {
		if err := req.Validate(); err != nil {
			return vocab.Reservation{}, vocab.Result{}, err
		}
		ds, ref, err := r.caps.draw(ctx, &req)
		switch {
		case err != nil:
			return vocab.Reservation{}, vocab.Result{}, err
		case ref != nil && (req.Mode == "" || req.Mode == vocab.Enforce):
			return vocab.Reservation{}, vocab.Result{BlockedAt: ref.blocked(&req), RetryAfter: max(ref.retry, time.Millisecond)}, nil
		case ref != nil:
			would = ref.blocked(&req)
		}
		taken = ds
	}
	done, err := b.breakerFor(req.Org).Allow()
	if err != nil {
		r.caps.giveBack(taken, nil)
		return vocab.Reservation{}, vocab.Result{}, unavailable(req.Org, b.name, err)
	}
	res, out, err := b.eng.Reserve(ctx, req, opt)
	done(redisFailure(err))
	switch {
	case err == nil && !out.Allowed && !out.Replayed:
		r.caps.giveBack(taken, out.BlockedAt)
	case err != nil || !out.Allowed || out.Replayed:
		r.caps.giveBack(taken, nil)
	}
	if err == nil && would != nil && out.WouldBlock == nil {
		out.WouldBlock = would
	}
	if err == nil {
		r.metrics.atBound(b.name, &out)
	}
	if errors.Is(err, ErrBadReply) {
		r.metrics.replyError(b.name)
	}
	r.metrics.boundRefusal(err)
	return res, out, err
}

// redisFailure is err when it says Redis failed (for a breaker), else nil.
func redisFailure(err error) error {
	if isRedisFailure(err) {
		return err
	}
	return nil
}

// Commit settles a reservation of org on the Redis of route (Engine.Commit).
func (r *Engines) Commit(ctx context.Context, route vocab.Route, org string, anchorDay int, id string, used int64) (vocab.Reservation, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return vocab.Reservation{}, err
	}
	return b.eng.Commit(ctx, org, anchorDay, id, used)
}

// CommitUsed settles a reservation of org with used units per metric on the Redis of
// route (Engine.CommitUsed).
func (r *Engines) CommitUsed(ctx context.Context, route vocab.Route, org string, anchorDay int, id string, used map[string]int64) (vocab.Reservation, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return vocab.Reservation{}, err
	}
	return b.eng.CommitUsed(ctx, org, anchorDay, id, used)
}

// Release gives a reservation of org back on the Redis of route (Engine.Release).
func (r *Engines) Release(ctx context.Context, route vocab.Route, org string, anchorDay int, id string) (vocab.Reservation, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return vocab.Reservation{}, err
	}
	return b.eng.Release(ctx, org, anchorDay, id)
}

// Reservation reads a reservation of org on the Redis of route (Engine.Reservation).
func (r *Engines) Reservation(ctx context.Context, route vocab.Route, org string, anchorDay int, id string) (vocab.Reservation, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return vocab.Reservation{}, err
	}
	return b.eng.Reservation(ctx, org, anchorDay, id)
}

// SweepReservations expires the due reservations on every Redis this router has
// opened (Engine.SweepReservations), and returns how many it expired. A dedicated
// Redis that fails is skipped for a growing pause (EnginesConfig.PollBackoff), so an
// org's unreachable redis_url is tried, and its failure reported, at most once per
// pause, and at the longest once a minute.
func (r *Engines) SweepReservations(ctx context.Context) (int, error) {
	r.mu.Lock()
	open := slices.Clone(r.open)
	r.mu.Unlock()
	var n int
	var errs []error
	for _, b := range open {
		dedicated := b.name == DedicatedPool
		if dedicated && b.poll.ready(time.Now()) != nil {
			continue // away: in its backoff, skipped without a word
		}
		got, err := b.eng.SweepReservations(ctx)
		n += got
		if dedicated {
			err = b.poll.done(err, time.Now(), r.cfg.PollBackoff)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("pool %s: %w", b.name, err))
		}
	}
	return n, errors.Join(errs...)
}

// RunReservationSweep runs SweepReservations every interval (500 ms when 0) until ctx
// ends, first opening the default pool and every configured pool so their
// reservations expire even before anything else asks for them; each dedicated Redis
// is swept once something (the worker's flush) has opened it. Errors go to logf.
func (r *Engines) RunReservationSweep(ctx context.Context, interval time.Duration, logf func(error)) {
	if interval <= 0 {
		interval = 500 * time.Millisecond
	}
	_, _ = r.backendFor(r.defaultURL)
	for _, u := range r.classes {
		_, _ = r.backendFor(u)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sctx, cancel := context.WithTimeout(ctx, 10*interval)
		if _, err := r.SweepReservations(sctx); err != nil && ctx.Err() == nil && logf != nil {
			logf(err)
		}
		cancel()
	}
}

// OpenReservations reads a page of org's open reservations on the Redis of route
// (Engine.OpenReservations).
func (r *Engines) OpenReservations(ctx context.Context, route vocab.Route, org string, anchorDay int, f OpenFilter, after OpenCursor, limit int) ([]vocab.Reservation, OpenCursor, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return nil, OpenCursor{}, err
	}
	return b.eng.OpenReservations(ctx, org, anchorDay, f, after, limit)
}

// Extend moves a held reservation's expiry on the Redis of route (Engine.Extend).
func (r *Engines) Extend(ctx context.Context, route vocab.Route, org string, anchorDay int, id string, ttl time.Duration) (vocab.Reservation, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return vocab.Reservation{}, err
	}
	return b.eng.Extend(ctx, org, anchorDay, id, ttl)
}

// InFlight reads org's in-flight units on the Redis of route (Engine.InFlight).
func (r *Engines) InFlight(ctx context.Context, route vocab.Route, org string) (map[Counter]int64, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return nil, err
	}
	return b.eng.InFlight(ctx, org)
}

// PoolEngines returns the engine of every shared Redis: the default one and each pool
// class's, each once, opened on first use (not the orgs' dedicated ones). The worker
// pops their dirty-org indexes (Engine.PopDirtyOrgs).
func (r *Engines) PoolEngines() ([]*Engine, error) {
	urls := []string{r.defaultURL}
	for _, u := range r.classes {
		if !slices.Contains(urls, u) {
			urls = append(urls, u)
		}
	}
	slices.Sort(urls[1:])
	out := make([]*Engine, 0, len(urls))
	var errs []error
	for _, u := range urls {
		b, err := r.backendFor(u)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, b.eng)
	}
	return out, errors.Join(errs...)
}
