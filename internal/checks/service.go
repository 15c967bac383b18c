package checks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Decider decides checks on the Redis an org's route names. *quota.Engines satisfies
// it. Decide answers every check of a batch in place (a single check is a batch of
// one); its errors are the engine's (quota.ErrInvalid, ErrOverloaded, ErrUnavailable,
// ErrIdempotencyConflict, *quota.BoundError, context errors), which the Service gives
// the kinds they answer with (engineError).
type Decider interface {
	Decide(ctx context.Context, cs []quota.Check)
	// Now is the time route's checks are decided at (the engine's Redis time), which
	// judges a throttle's expiry and the seconds until a reset.
	Now(route vocab.Route) time.Time
}

// Reservations holds and settles reservations on the Redis an org's route names.
// *quota.Engines satisfies it; its errors are the engine's, with
// ErrReservationNotFound and *quota.StateError.
type Reservations interface {
	Reserve(ctx context.Context, route vocab.Route, req quota.Request, opt quota.ReserveOptions) (vocab.Reservation, vocab.Result, error)
	Commit(ctx context.Context, route vocab.Route, org string, anchorDay int, id string, used int64) (vocab.Reservation, error)
	CommitUsed(ctx context.Context, route vocab.Route, org string, anchorDay int, id string, used map[string]int64) (vocab.Reservation, error)
	Release(ctx context.Context, route vocab.Route, org string, anchorDay int, id string) (vocab.Reservation, error)
	Reservation(ctx context.Context, route vocab.Route, org string, anchorDay int, id string) (vocab.Reservation, error)
	OpenReservations(ctx context.Context, route vocab.Route, org string, anchorDay int, f quota.OpenFilter, after quota.OpenCursor, limit int) ([]vocab.Reservation, quota.OpenCursor, error)
	// Extend moves a held reservation's expiry to now + ttl (concurrency's heartbeat).
	Extend(ctx context.Context, route vocab.Route, org string, anchorDay int, id string, ttl time.Duration) (vocab.Reservation, error)
	// InFlight is the units held at once per counter by reservations that charged a
	// concurrent limit.
	InFlight(ctx context.Context, route vocab.Route, org string) (map[quota.Counter]int64, error)
}

// Engine is the quota engine the Service asks: a Decider and Reservations.
type Engine interface {
	Decider
	Reservations
}

// Config is what a Service needs.
type Config struct {
	Cache  *tenants.Cache // resolved orgs, teams and users
	Engine Engine         // nil: every check and reservation is refused as unavailable
	Logger *slog.Logger   // checks of a batch not decided; slog.Default() when nil
}

// Service is the check service: both transports of a check (POST /v1/check and its
// batch and reservations in internal/httpapi, Envoy's ShouldRateLimit in internal/rls)
// make one call of it. It authorizes the caller for the org, resolves the org, team,
// user and metric into limits and a route, asks the engine, and describes the
// decision (tightest limit, Retry-After, warning); its errors carry derrors kinds,
// which each transport maps to its own statuses in one table.
type Service struct {
	cache  *tenants.Cache
	engine Engine
	log    *slog.Logger
	// headroom is each client-leased path's least remaining headroom as last seen,
	// which sizes its next lease (leases.go); a bounded LRU of headroomPaths paths.
	headroom *lru.Cache[string, int64]
}

// NewService returns the check service.
func NewService(c Config) *Service {
	headroom, _ := lru.New[string, int64](headroomPaths) // errors only for a size below 1
	s := &Service{cache: c.Cache, engine: c.Engine, log: c.Logger, headroom: headroom}
	if s.log == nil {
		s.log = slog.Default()
	}
	return s
}

// ErrNoEngine answers the checks of a service built without a quota engine.
var ErrNoEngine = derrors.E(derrors.Unavailable, "no quota engine is configured", nil)

// Decision is a decided check and its description: what every transport answers.
type Decision struct {
	Result  vocab.Result
	Outcome quota.Outcome
	// Mode is the org's mode; Throttle the throttle its limits were multiplied by
	// (PPM 0: none).
	Mode     vocab.Mode
	Throttle tenants.Throttle
	// RateLimit is what the RateLimit-* headers say, when HasRateLimit (some level
	// has a limit).
	RateLimit    RateLimit
	HasRateLimit bool
	// RetryAfter is a denied check's Retry-After in whole seconds; 0 when allowed.
	RetryAfter int64
	// Warning is a warn-mode org's warning of a check that would have been denied.
	Warning string
	// Multi is true for a decision asked with Input.Costs (one metric or several), or
	// priced (spend is one more metric, money.go): its levels and blocked limit name
	// their metric.
	Multi bool
	// Metric is the check's metric (of several, the first by name): the metric of a
	// level that does not name its own, which names its RateLimit-Policy item.
	Metric string
}

// describe completes d from its result, judged at now.
func describe(d *Decision, now time.Time) {
	d.RateLimit, d.HasRateLimit = tightest(d.Result, now, d.Metric)
	if !d.Result.Allowed {
		d.RetryAfter = retryAfterSeconds(d.Result)
	}
	d.Warning = warning(d.Result, d.Mode)
}

// enter marks a call of the service (name: "checks.Check", ...) with an event on the
// transport's span, when it is recording: the service adds no span of its own, so a
// check's trace keeps its shape (the server span, quota.check under it) and what it
// allocates (docs/TRACING.md), and yet shows that the check entered the service once.
// With tracing off the context carries no recording span and this costs a lookup.
func enter(ctx context.Context, name string) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(name)
	}
}

// Check authorizes, resolves and decides one check: a batch of one. Its errors
// carry derrors kinds: Invalid (a field, named), NotFound (org or team; another org's
// is not found either), Forbidden (a key without the check scope), Unprocessable (an
// unknown metric, *tenants.UnknownMetricError; an idempotency conflict), Unavailable
// (the tenancy store down and nothing cached; no engine; the quota store down under a
// closed fail mode), Overloaded (too many checks of the org in flight), Canceled.
func (s *Service) Check(ctx context.Context, c Caller, in Input) (Decision, error) {
	enter(ctx, "checks.Check")
	ins, items := [1]Input{in}, [1]Item{}
	if err := s.decide(ctx, c, ins[:], items[:]); err != nil {
		return Decision{}, err
	}
	if items[0].Err != nil {
		return Decision{}, items[0].Err
	}
	return items[0].Decision, nil
}

// Item is one check of a batch: its decision, or why it was not decided.
type Item struct {
	Decision
	Err error
}

// TightestItem is the index of the item whose RateLimit header fields a batch's answer
// carries, -1 when none has a limit: of the denied items the one whose retry is
// furthest away, else the allowed item with the least remaining (then the soonest
// reset), the first of equals. A client that waits as those fields say waits for the
// batch's tightest limit; each item's own levels are in its result.
func TightestItem(items []Item) int {
	best := -1
	for i := range items {
		it := &items[i]
		if it.Err != nil || !it.HasRateLimit {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := &items[best]
		denied, bDenied := !it.Result.Allowed, !b.Result.Allowed
		switch {
		case denied != bDenied:
			if denied {
				best = i
			}
		case denied:
			if it.RateLimit.Reset > b.RateLimit.Reset {
				best = i
			}
		case it.RateLimit.Remaining < b.RateLimit.Remaining ||
			(it.RateLimit.Remaining == b.RateLimit.Remaining && it.RateLimit.Reset < b.RateLimit.Reset):
			best = i
		}
	}
	return best
}

// CheckBatch decides each check on its own, in order, all sent to the engine in one
// Decide. Each item's error is one of Check's; the batch's own error is ErrNoEngine
// only, when some check resolved.
func (s *Service) CheckBatch(ctx context.Context, c Caller, ins []Input) ([]Item, error) {
	enter(ctx, "checks.CheckBatch")
	items := make([]Item, len(ins))
	if err := s.decide(ctx, c, ins, items); err != nil {
		return nil, err
	}
	for i := range items {
		if items[i].Err == nil {
			continue
		}
		if k := derrors.KindOf(items[i].Err); k == derrors.Unavailable || k == derrors.Internal {
			s.log.Warn("batch check not decided", "org", ins[i].Org, "err", items[i].Err.Error())
		}
	}
	return items, nil
}

// decide is every check's one way: each input resolved (refused alone when it cannot
// be), all resolved checks decided by the engine in one Decide, and each decision
// described into items[i]. Its own error is ErrNoEngine, when some input resolved and
// there is no engine to decide it: an input refused on its own says why first.
func (s *Service) decide(ctx context.Context, c Caller, ins []Input, items []Item) error {
	b := newBatch(len(ins))
	defer b.done()
	for i, in := range ins {
		r, err := s.resolve(ctx, c, in, nil)
		if err == nil {
			err = price(&r.req, r.price)
		}
		if err != nil {
			items[i].Err = err
			continue
		}
		items[i].Decision = r.decision(in.Costs != nil)
		b.checks, b.slots = append(b.checks, quota.Check{Route: r.route, Request: r.req}), append(b.slots, i)
	}
	if s.engine == nil && len(b.checks) > 0 {
		return ErrNoEngine
	}
	s.ask(ctx, b.checks)
	for j, i := range b.slots {
		qc := &b.checks[j]
		if qc.Err != nil {
			items[i].Err = qc.Err
			continue
		}
		items[i].Result, items[i].Outcome = qc.Result, qc.Outcome
		describe(&items[i].Decision, s.engine.Now(qc.Route))
	}
	return nil
}

// ask has the engine decide cs in one Decide, and gives each error the kind it
// answers with (engineError).
func (s *Service) ask(ctx context.Context, cs []quota.Check) {
	if len(cs) == 0 {
		return
	}
	s.engine.Decide(ctx, cs)
	for i := range cs {
		if cs[i].Err != nil {
			cs[i].Err = engineError(cs[i].Err)
		}
	}
}

// batch is the engine's checks of one decide and the item each answers. A decide of
// a few inputs reuses the slices of one from batches: the engine's Decide keeps the
// slice it is given no longer than the call.
type batch struct {
	checks []quota.Check
	slots  []int
	pooled *batch // where the slices came from, nil when made for this decide
}

const pooledBatch = 4 // the most inputs a pooled batch holds

var batches = sync.Pool{New: func() any {
	return &batch{checks: make([]quota.Check, 0, pooledBatch), slots: make([]int, 0, pooledBatch)}
}}

// newBatch returns an empty batch with room for n checks.
func newBatch(n int) batch {
	if n > pooledBatch {
		return batch{checks: make([]quota.Check, 0, n), slots: make([]int, 0, n)}
	}
	p := batches.Get().(*batch)
	return batch{checks: p.checks, slots: p.slots, pooled: p}
}

// done gives a pooled batch's slices back, holding nothing of its checks.
func (b *batch) done() {
	if p := b.pooled; p != nil {
		clear(b.checks[:cap(b.checks)])
		p.checks, p.slots = b.checks[:0], b.slots[:0]
		batches.Put(p)
	}
}

// engineError gives an error of the quota engine the kind it answers with: its own
// when the engine says what is wrong (invalid, overloaded, a refusal such as an
// idempotency conflict), else unavailable, since a check the engine could not decide
// is worth retrying. This is the one place that says which errors are retryable. The
// detail says which store failed.
func engineError(err error) error {
	if errors.Is(err, quota.ErrIdempotencyConflict) {
		msg := "this key was first used (in the last 24 hours) with a different request: team, user, metric or cost differ; nothing was counted. Use a new key for a new request"
		return derrors.E(derrors.Unprocessable, "idempotency_key: "+msg, err, derrors.FieldError{Field: "idempotency_key", Message: msg})
	}
	var be *quota.BoundError
	if errors.As(err, &be) { // the org's bounds on the shared Redis (quota/bounds.go)
		switch be.Bound {
		case quota.BoundIdempotencyRecords:
			msg := fmt.Sprintf("the org holds %d idempotency records, its most (idempotency_records); nothing was counted. Retry without an idempotency key, or once older records expire", be.Limit)
			return derrors.E(derrors.Unprocessable, "idempotency_key: "+msg, err, derrors.FieldError{Field: "idempotency_key", Message: msg})
		default:
			msg := fmt.Sprintf("the org has named %d distinct unregistered users this billing period, its most (unregistered_users); nothing was counted. Register the user, or name one already counted", be.Limit)
			return derrors.E(derrors.Unprocessable, "user: "+msg, err, derrors.FieldError{Field: "user", Message: msg})
		}
	}
	switch derrors.KindOf(err) {
	case derrors.Overloaded:
		return derrors.E(derrors.Overloaded, "too many checks of this org are in flight; retry shortly", err)
	case derrors.Unavailable, derrors.Internal:
		return derrors.E(derrors.Unavailable, "the quota store is unavailable; retry shortly", err)
	}
	return err
}
