package middleware

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// DefaultSlotTTL is the ttl of the reservation Concurrency holds when its
// ReserveFunc sets none. While the handler runs it is extended every third of its
// ttl (WithHeartbeat), so a holder that dies gives its slot back within a ttl.
const DefaultSlotTTL = 30 * time.Second

// WithHeartbeat sets how often Concurrency extends the reservation of a handler that
// is still running (a third of its ttl otherwise).
func WithHeartbeat(d time.Duration) Option { return func(c *config) { c.heartbeat = d } }

// WithSettleTimeout bounds the commit or release after the handler, all its
// attempts together (10 s otherwise); the release of a request whose context ended
// too.
func WithSettleTimeout(d time.Duration) Option { return func(c *config) { c.settleTimeout = d } }

// Concurrency returns a middleware that holds a slot for each request while next
// runs: a reservation of fn's request (e.g. {Metric: "requests", Amount: 1}, or
// Amounts for requests and tokens at once) against the org's, team's and user's
// concurrent limits, and all their other limits, as Reserve's.
//
//   - Denied (every slot taken): 429 with Retry-After and RateLimit-*, as Check.
//     Quotaplane unreachable: the client's FailPolicy decides, as for Check (allowed:
//     next runs holding nothing; refused: 503).
//   - While next runs the reservation is extended every heartbeat by its ttl (TTL of
//     fn's request, DefaultSlotTTL when 0), so a stream longer than the ttl keeps its
//     slot, and a process that dies loses it within a ttl.
//   - It is given back when next is done: it returns (or writes an error) or panics
//     (then the panic goes on). Not when the request's context ends (the client went
//     away, a timeout): a handler still running still holds its slot, and what it
//     reports after the disconnect is counted. The beats stop then, so a handler that
//     never returns holds the slot a ttl at most (the reservation expires, released).
//     The slot is back before the response ends, so a caller's next request finds it
//     free; WithSettleTimeout bounds that wait.
//     WithSettleTimeout bounds that wait.
//   - Given back means released (the request counts nowhere) unless next reported
//     usage (ReportUsage, ReportMetricUsage; they add): then that is committed, which
//     gives the slot back all the same, on success and failure alike. To count every
//     request in its other windows, report it: ReportMetricUsage(ctx, "requests", 1).
//
// OnExpiry is "release" unless fn sets it. Every call to Quotaplane is bounded: the
// reservation by the client's timeouts, each extend by the heartbeat, the release by
// WithSettleTimeout.
func Concurrency(c Quota, fn ReserveFunc, opts ...Option) func(http.Handler) http.Handler {
	cfg := newConfig(opts)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, ok := request(cfg, w, r, next, fn)
			if !ok {
				return
			}
			if req.TTL <= 0 {
				req.TTL = DefaultSlotTTL
			}
			if req.OnExpiry == "" {
				req.OnExpiry = "release"
			}
			res, d, held := cfg.reserve(w, r, next, c, req)
			if !held {
				return
			}
			ctx, u := withUsage(context.WithValue(r.Context(), decisionKey{}, d), res.ID)
			s := &slot{c: c, cfg: cfg, res: res, u: u, r: r}
			// The beats stop when the request's context ends: a handler deaf to it
			// keeps its slot until it returns, for a ttl at most (then the
			// reservation expires and is released), so a stuck one leaks nothing.
			stop := s.hold(ctx, req.TTL)
			returned := false
			defer func() {
				stop()
				if returned {
					s.settle(ctx, "the handler returned", false)
				} else { // next panicked (or called runtime.Goexit): the panic goes on after
					s.settle(ctx, "the handler panicked", true)
				}
			}()
			next.ServeHTTP(w, r.WithContext(ctx))
			returned = true
		})
	}
}

// slot is the reservation Concurrency holds for one request.
type slot struct {
	c    Quota
	cfg  *config
	res  *client.Reservation
	u    *usage
	r    *http.Request
	once sync.Once
}

// hold extends the reservation every heartbeat until stop is called (or ctx ends);
// stop returns once the heartbeat has stopped.
func (s *slot) hold(ctx context.Context, ttl time.Duration) (stop func()) {
	every := s.cfg.heartbeat
	if every <= 0 {
		every = max(ttl/3, 100*time.Millisecond)
	}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				// Bounded by the heartbeat: a slow Quotaplane delays no later beat, and
				// the request's end cancels it.
				ectx, cancel := context.WithTimeout(ctx, every)
				_, err := s.c.Extend(ectx, s.res.ID, ttl)
				cancel()
				var pe *client.Error
				switch {
				case err == nil, ctx.Err() != nil:
				case errors.As(err, &pe) && (pe.StatusCode == http.StatusConflict || pe.StatusCode == http.StatusNotFound):
					// settled, expired or unknown: nothing left to keep
					s.cfg.log.Warn("quotaplane: the slot was lost while the handler ran", "reservation", s.res.ID, "err", err)
					return
				default:
					s.cfg.log.Warn("quotaplane: extend failed; retried at the next beat", "reservation", s.res.ID, "err", err)
				}
			}
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}

// settle gives the slot back, once: what the handler reported is committed,
// otherwise everything is released.
func (s *slot) settle(ctx context.Context, why string, failed bool) {
	s.once.Do(func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.settleTimeout)
		defer cancel()
		st := s.u.settle(sctx, s.c, s.res, false)
		st.Failed = failed
		if st.Err != nil {
			s.cfg.log.Warn("quotaplane: "+st.How+" of a slot failed; it comes back at its expiry", "reservation", s.res.ID, "why", why, "err", st.Err)
		}
		if s.cfg.onSettled != nil {
			s.cfg.onSettled(s.r, st)
		}
	})
}
