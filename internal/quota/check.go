package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Check decides one check. A denied check (Result.Allowed false) is not an error.
//
// Errors: ErrInvalid (joined, one per problem) for a bad request; ErrUnavailable
// when Redis did not answer (the check was counted at most once); ErrNotHydrated
// when the org's counters could not be restored; ErrIdempotencyConflict when its
// idempotency key was first used with a different request (nothing counted);
// ErrClosed after Close; the context's error when ctx ends first (a check already
// sent may have counted).
func (e *Engine) Check(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	return e.check(ctx, req)
}

// check is Check of a request already validated: the Engines validates each request
// once, before choosing the engine. A leasable check of a hot path is answered from the
// path's lease when it can be (lease.go).
func (e *Engine) check(ctx context.Context, req Request) (Result, error) {
	if e.leases == nil || !leasable(&req) {
		return e.checkRedis(ctx, req)
	}
	p, res, ok := e.leases.admit(ctx, &req)
	if ok {
		return res, nil
	}
	res, err := e.checkRedis(ctx, req)
	if err == nil && p != nil {
		p.observe(&res)
	}
	return res, err
}

// checkRedis decides a valid request in Redis: one run of check.lua.
func (e *Engine) checkRedis(ctx context.Context, req Request) (Result, error) {
	c := e.getCall()
	e.build(c, &req, e.Now())
	var a attempt
	for {
		if c.ask != "" {
			e.sendAsking(ctx, c)
		} else if err := e.submit(ctx, c); err != nil {
			return Result{}, err // c may still be owned by the loop: not recycled
		}
		res, v, pause, err := e.next(c, &a)
		switch v {
		case resend:
			e.traceEvent(ctx, "quota.resend")
			err = e.sleep(ctx, pause)
		case rehydrate:
			e.traceEvent(ctx, "quota.hydrate")
			err = e.hydrate(ctx, c.org, c.period)
		}
		if v == settled || err != nil {
			if res.WouldBlock != nil && !res.Replayed && err == nil {
				e.wb.record(c, res.WouldBlock)
			}
			e.putCall(c)
			return res, err
		}
		e.build(c, &req, e.Now()) // counted when sent: a window bucket may have ended
	}
}

// CheckBatch decides several checks in one pipeline, each independently, and
// returns a result or an error for each, in order. The errors are those of Check.
// Its checks go through the same steps as Check's (next): re-sent after a refusal
// without a run, hydrated once, failed alike.
func (e *Engine) CheckBatch(ctx context.Context, reqs []Request) ([]Result, []error) {
	return e.checkBatch(ctx, reqs, true)
}

// checkBatch is CheckBatch, validating each request unless the caller (the Engines)
// already has.
func (e *Engine) checkBatch(ctx context.Context, reqs []Request, validate bool) ([]Result, []error) {
	results := make([]Result, len(reqs))
	errs := make([]error, len(reqs))
	select {
	case <-e.closing:
		for i := range errs {
			errs[i] = ErrClosed
		}
		return results, errs
	default:
	}
	type item struct {
		c *call
		i int // in reqs
		a attempt
	}
	items := make([]item, 0, len(reqs))
	now := e.Now()
	for i := range reqs {
		if validate {
			if err := reqs[i].Validate(); err != nil {
				errs[i] = err
				continue
			}
		}
		c := &call{ctx: ctx}
		e.build(c, &reqs[i], now)
		items = append(items, item{c: c, i: i})
	}
	var p pipeState
	for len(items) > 0 {
		var asks []*call
		sent := make([]*call, 0, len(items))
		for _, it := range items {
			if it.c.ask != "" {
				asks = append(asks, it.c)
			} else {
				sent = append(sent, it.c)
			}
		}
		e.exec(ctx, sent, &p)
		for _, c := range asks {
			e.sendAsking(ctx, c)
		}
		var again []item
		var pause time.Duration
		resent := false
		var hydrated map[string]error // this round's hydrations: one per org and period
		for k := range items {
			it := &items[k]
			res, v, d, err := e.next(it.c, &it.a)
			switch v {
			case settled:
				results[it.i], errs[it.i] = res, err
				if res.WouldBlock != nil && !res.Replayed && err == nil {
					e.wb.record(it.c, res.WouldBlock)
				}
				continue
			case resend:
				pause, resent = max(pause, d), true
			case rehydrate:
				key := it.c.org + "|" + it.c.period.ID
				herr, done := hydrated[key]
				if !done {
					if hydrated == nil {
						hydrated = map[string]error{}
					}
					herr = e.hydrate(ctx, it.c.org, it.c.period)
					hydrated[key] = herr
				}
				if herr != nil {
					errs[it.i] = herr
					continue
				}
			}
			again = append(again, *it)
		}
		if resent {
			if err := e.sleep(ctx, pause); err != nil {
				for _, it := range again {
					errs[it.i] = err
				}
				return results, errs
			}
		}
		// Sent again as built now: a window bucket may have ended meanwhile.
		now := e.Now()
		for _, it := range again {
			e.build(it.c, &reqs[it.i], now)
		}
		items = again
	}
	return results, errs
}

// attempt is one check's way to its answer across sends, for Check and CheckBatch alike.
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
func (e *Engine) next(c *call, a *attempt) (Result, step, time.Duration, error) {
	if c.err != nil {
		if isScriptError(c.err) { // this check's own failure: never re-sent, never the breaker's
			return Result{}, settled, 0, fmt.Errorf("quota check %s: %w: %w", c.org, ErrBadReply, c.err)
		}
		if e.cluster != nil && a.refused.IsZero() {
			a.refused = time.Now()
		}
		if pause, ok := e.retryDelay(c, a.refused, a.tries); ok {
			a.tries++
			c.err = nil
			return Result{}, resend, pause, nil
		}
		return Result{}, settled, 0, checkError(c.err)
	}
	res, status, err := c.parse()
	if status != statusHydrate || err != nil {
		return res, settled, 0, err
	}
	if a.hydrated == c.period.ID {
		return Result{}, settled, 0, fmt.Errorf("check %s: %w: marker still missing after hydration", c.org, ErrNotHydrated)
	}
	a.hydrated = c.period.ID
	c.reply = ""
	return Result{}, rehydrate, 0, nil
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

// parse decodes c's reply into a Result; see parseReply and parseCompact.
func (c *call) parse() (Result, byte, error) {
	switch c.src {
	case "":
	case settleSrc: // the settlement reads c.reply itself
		return Result{}, statusAllowed, nil
	default:
		return c.parseReserve()
	}
	if isPacked(c.reply) {
		return parseCompact(c.reply, &c.req, c.period, c.nowMs)
	}
	if c.reply == "C" {
		return Result{}, statusConflict, fmt.Errorf("check %s: idempotency key %q: %w", c.org, c.req.IdempotencyKey, ErrIdempotencyConflict)
	}
	if err := c.boundError(); err != nil {
		return Result{}, statusBound, err
	}
	res, status, err := parseReply(c.reply)
	if c.req.More == nil { // a one-metric request's labels do not name the metric
		for i := range res.Levels {
			res.Levels[i].Metric = c.req.Metric
		}
		if res.BlockedAt != nil {
			res.BlockedAt.Metric = c.req.Metric
		}
		if res.WouldBlock != nil {
			res.WouldBlock.Metric = c.req.Metric
		}
	}
	return res, status, err
}
