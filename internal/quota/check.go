package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Check decides one check. A denied check (Result.Allowed false) is not an error.
//
// Errors: ErrInvalid (joined, one per problem) for a bad request; ErrUnavailable
// when Redis did not answer (the check was counted at most once); ErrNotHydrated
// when the org's counters could not be restored; ErrIdempotencyConflict when its
// idempotency key was first used with a different request (nothing counted);
// ErrClosed after Close; the context's error when ctx ends first (a check already
// sent may have counted).
func (e *Engine) Check(ctx context.Context, req Request) (vocab.Result, error) {
	if err := req.Validate(); err != nil {
		return vocab.Result{}, err
	}
	c := Check{Request: req}
	e.decide(ctx, []*Check{&c})
	return c.Result, c.Err
}

// CheckBatch decides several checks, each independently, and returns a result or an
// error for each, in order. The errors are those of Check.
func (e *Engine) CheckBatch(ctx context.Context, reqs []Request) ([]vocab.Result, []error) {
	cs := make([]Check, len(reqs))
	valid := make([]*Check, 0, len(reqs))
	for i := range reqs {
		c := &cs[i]
		c.Request = reqs[i]
		if c.Err = c.Request.Validate(); c.Err == nil {
			valid = append(valid, c)
		}
	}
	e.decide(ctx, valid)
	results, errs := make([]vocab.Result, len(reqs)), make([]error, len(reqs))
	for i := range cs {
		results[i], errs[i] = cs[i].Result, cs[i].Err
	}
	return results, errs
}

// decide answers every check of cs (valid requests: the Engines validates each once,
// before choosing the engine) in place, its Result or its Err, each on its own: a
// single check is a batch of one. A leasable check of a hot path is answered from the
// path's lease when it can be (lease.go); the others are decided in Redis, each by one
// run of check.lua (run).
func (e *Engine) decide(ctx context.Context, cs []*Check) {
	select {
	case <-e.closing:
		for _, c := range cs {
			c.Err = ErrClosed
		}
		return
	default:
	}
	// A single check's calls are on the stack; a batch's allocated once.
	var one, pendOne [1]*call
	calls, pending := one[:0], pendOne[:0]
	if len(cs) > 1 {
		buf := make([]*call, 2*len(cs))
		calls, pending = buf[:0:len(cs)], buf[len(cs):len(cs)]
	}
	for i, ch := range cs {
		var p *leasePath
		if e.leases != nil && leasable(&ch.Request) {
			var ok bool
			if p, ch.Result, ok = e.leases.admit(ctx, &ch.Request); ok {
				continue
			}
		}
		c := e.getCall()
		c.ctx, c.item, c.path = ctx, i, p
		calls = append(calls, c)
	}
	if len(calls) == 0 {
		return
	}
	now := e.Now() // after the leases: taking one may have taken a round trip
	for _, c := range calls {
		e.build(c, &cs[c.item].Request, now)
	}
	e.run(ctx, append(pending, calls...))
	for _, c := range calls {
		ch := cs[c.item]
		ch.Result, ch.Err = c.res, c.fail
		if c.held {
			continue // the loop may still write to it: not recycled
		}
		if c.fail == nil {
			if b := c.res.WouldBlock; b != nil && !c.res.Replayed {
				e.wb.record(c, b)
			}
			if c.path != nil {
				c.path.observe(&c.res)
			}
		}
		e.putCall(c)
	}
}

// run sends built calls (checks or reservations) until each has its answer (c.res,
// or c.fail): one path for every check, whatever the batch. A check is sent again
// only as next says: after Redis refused it without running it (on a cluster, after
// the pause of the retry budget), or once its org's counters for the period are
// restored (hydrated once per org and period for the whole batch); each send is built
// again at the time it is sent, as a window bucket may have ended meanwhile.
//
// A single call goes through the batching loop, where it shares a pipeline with the
// checks of concurrent callers; several go as one pipeline of their own. run may
// reorder calls.
func (e *Engine) run(ctx context.Context, calls []*call) {
	var p pipeState
	for len(calls) > 0 {
		if c := calls[0]; len(calls) == 1 && c.ask == "" {
			if err := e.submit(ctx, c); err != nil {
				c.fail, c.held = err, true
				return
			}
		} else {
			// The calls redirected with ASK go one by one, the others together.
			n := 0
			for k, c := range calls {
				if c.ask == "" {
					calls[n], calls[k] = calls[k], calls[n]
					n++
				}
			}
			e.exec(ctx, calls[:n], &p)
			for _, c := range calls[n:] {
				e.sendAsking(ctx, c)
			}
		}
		again := calls[:0]
		var pause time.Duration
		resent := false
		var hydrated map[string]error // this round's hydrations: one per org and period
		for _, c := range calls {
			res, v, d, err := e.next(c, &c.a)
			switch v {
			case settled:
				c.res, c.fail = res, err
				continue
			case resend:
				pause, resent = max(pause, d), true
			case rehydrate:
				key := c.org + "|" + c.period.ID
				herr, done := hydrated[key]
				if !done {
					e.traceEvent(ctx, "quota.hydrate")
					herr = e.hydrate(ctx, c.org, c.period)
					if hydrated == nil {
						hydrated = map[string]error{}
					}
					hydrated[key] = herr
				}
				if herr != nil {
					c.fail = herr
					continue
				}
			}
			again = append(again, c)
		}
		if resent {
			e.traceEvent(ctx, "quota.resend")
			if err := e.sleep(ctx, pause); err != nil {
				for _, c := range again {
					c.fail = err
				}
				return
			}
		}
		now := e.Now()
		for _, c := range again {
			e.rebuild(c, now)
		}
		calls = again
	}
}

// rebuild builds c again, at now, from what it was built from.
func (e *Engine) rebuild(c *call, now time.Time) {
	if c.src == reserveSrc {
		e.buildReserve(c, &c.req, now, c.rsvID, c.rsvOpt)
		return
	}
	e.build(c, &c.req, now)
}

// attempt is one check's way to its answer across sends.
type attempt struct {
	refused  time.Time // the first refusal without a run: the retry budget starts there
	tries    int       // re-sends after a refusal so far
	hydrated string    // the period restored, if any: a re-send may fall in the next
}

// step is what follows a send.
type step uint8

const (
	settled   step = iota // the result and error are the check's answer
	resend                // Redis refused the check without running it: send it again after the pause
	rehydrate             // the org's counters for c.period are missing: hydrate, then send again
)

// next reads the reply (or error) of c's last send and says what follows. A check
// is re-sent only when Redis says it did not run it, within Config.RetryBudget
// (cluster.go); it is hydrated at most once per period.
func (e *Engine) next(c *call, a *attempt) (vocab.Result, step, time.Duration, error) {
	if c.err != nil {
		if isScriptError(c.err) { // this check's own failure: never re-sent, never the breaker's
			return vocab.Result{}, settled, 0, fmt.Errorf("quota check %s: %w: %w", c.org, ErrBadReply, c.err)
		}
		if e.cluster != nil && a.refused.IsZero() {
			a.refused = time.Now()
		}
		if pause, ok := e.retryDelay(c, a.refused, a.tries); ok {
			a.tries++
			c.err = nil
			return vocab.Result{}, resend, pause, nil
		}
		return vocab.Result{}, settled, 0, checkError(c.err)
	}
	res, status, err := c.parse()
	if status != statusHydrate || err != nil {
		return res, settled, 0, err
	}
	if a.hydrated == c.period.ID {
		return vocab.Result{}, settled, 0, fmt.Errorf("check %s: %w: marker still missing after hydration", c.org, ErrNotHydrated)
	}
	a.hydrated = c.period.ID
	c.reply = ""
	return vocab.Result{}, rehydrate, 0, nil
}

// isScriptError reports whether err is Redis's answer that a script failed as it ran
// (a Lua error: "ERR user_script:..." in Redis 7, "ERR Error running script" before),
// as opposed to Redis not answering: a stored value the script cannot read fails that
// one request, not the pool.
func isScriptError(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.HasPrefix(msg, "ERR ") && strings.Contains(msg, "script")
}

func checkError(err error) error {
	if errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("quota check: %w: %w", ErrUnavailable, err)
}

// parse reads c's reply: the answers every script of a check shares ("H": hydrate
// first; "C": an idempotency conflict; "Q": past one of the org's bounds), else its
// decision (decode), framed by reserve.lua as parseReserve says.
func (c *call) parse() (vocab.Result, byte, error) {
	if c.src == settleSrc { // the settlement reads c.reply itself
		return vocab.Result{}, statusAllowed, nil
	}
	switch c.reply {
	case "H":
		return vocab.Result{}, statusHydrate, nil
	case "C":
		what := "check"
		if c.src == reserveSrc {
			what = "reserve"
		}
		return vocab.Result{}, statusConflict, fmt.Errorf("%s %s: idempotency key %q: %w", what, c.org, c.req.IdempotencyKey, ErrIdempotencyConflict)
	}
	if err := c.boundError(); err != nil {
		return vocab.Result{}, statusBound, err
	}
	if c.src == reserveSrc {
		return c.parseReserve()
	}
	return decode(c.reply, &c.req, c.period, c.nowMs)
}
