package client

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// maxBatch is the most checks one POST /v1/check/batch carries (API.md "Check").
const maxBatch = 100

// batchesInFlight bounds the batch requests a client has in flight: each check of a
// batch holds one of its org's in-flight checks on the server (256 by default,
// QUOTA_MAX_INFLIGHT_PER_ORG) until the batch is answered, so two full batches stay
// under it where ten at once would be refused in part (503). The checks that arrive
// meanwhile fill the next batches.
const batchesInFlight = 2

// batcher coalesces the checks of a client (WithBatching): the first check starts a
// batch and a timer of wait; the batch is sent when the timer fires or when it holds
// maxBatch checks, whichever comes first, by exactly one of them (whoever detaches it
// from cur under mu).
type batcher struct {
	c      *Client
	wait   time.Duration
	mu     sync.Mutex
	cur    *pending
	flying chan struct{} // a slot per batch request in flight (batchesInFlight)
}

func newBatcher(c *Client, wait time.Duration) *batcher {
	return &batcher{c: c, wait: wait, flying: make(chan struct{}, batchesInFlight)}
}

// pending is a batch being filled, then sent.
type pending struct {
	reqs  []CheckRequest
	ctxs  []context.Context
	outs  []checkOutcome
	timer *time.Timer
	done  chan struct{} // closed once outs are written
}

type checkOutcome struct {
	res *CheckResult
	err error
}

// check decides req in the next batch, and answers as Check without batching.
func (b *batcher) check(ctx context.Context, req CheckRequest) (*CheckResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("quotaplane client: POST /v1/check: %w", err)
	}
	b.mu.Lock()
	p := b.cur
	if p == nil {
		p = &pending{done: make(chan struct{})}
		b.cur = p
		p.timer = time.AfterFunc(b.wait, func() { b.flush(p) })
	}
	i := len(p.reqs)
	p.reqs = append(p.reqs, req)
	p.ctxs = append(p.ctxs, ctx)
	full := len(p.reqs) == maxBatch
	if full {
		b.cur = nil
	}
	b.mu.Unlock()
	if full {
		p.timer.Stop()
		go b.send(p)
	}
	select {
	case <-p.done:
		return p.outs[i].res, p.outs[i].err
	case <-ctx.Done():
		return nil, fmt.Errorf("quotaplane client: POST /v1/check: %w", ctx.Err())
	}
}

// flush sends p if it is still the batch being filled.
func (b *batcher) flush(p *pending) {
	b.mu.Lock()
	if b.cur != p {
		b.mu.Unlock()
		return
	}
	b.cur = nil
	b.mu.Unlock()
	b.send(p)
}

// close sends the batch being filled, and waits for its answer.
func (b *batcher) close() {
	b.mu.Lock()
	p := b.cur
	b.cur = nil
	b.mu.Unlock()
	if p != nil {
		p.timer.Stop()
		b.send(p)
	}
}

// send decides p's checks, those whose callers still wait, and writes each outcome:
// a lone check as POST /v1/check, more as one POST /v1/check/batch. An item the
// batch could not decide (a 5xx problem), or a batch refused as a whole for its
// shape (400, 413, 422), is sent again as a check of its own, so that each caller
// gets what Check without batching gives: its retries, its fail policy, its error.
func (b *batcher) send(p *pending) {
	c := b.c
	p.outs = make([]checkOutcome, len(p.reqs))
	defer close(p.done)
	if len(p.reqs) > 1 {
		b.flying <- struct{}{}
		defer func() { <-b.flying }()
	}
	var live []int
	for i, ctx := range p.ctxs {
		if ctx.Err() == nil {
			live = append(live, i)
		}
	}
	alone := func(idx []int) {
		var wg sync.WaitGroup
		for _, i := range idx {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.outs[i].res, p.outs[i].err = c.check(p.ctxs[i], p.reqs[i])
			}()
		}
		wg.Wait()
	}
	if len(live) <= 1 {
		alone(live)
		return
	}
	in := struct {
		Checks []checkBody `json:"checks"`
	}{Checks: make([]checkBody, len(live))}
	for j, i := range live {
		in.Checks[j] = p.reqs[i].body()
	}
	// The request runs for all its callers: not cut by the first one's cancel, it
	// carries its headers (a trace) all the same.
	ctx := context.WithoutCancel(p.ctxs[live[0]])
	r, err := c.do(ctx, c.budget, http.MethodPost, "/v1/check/batch", in)
	if err != nil {
		for j, i := range live {
			p.outs[i].res, p.outs[i].err = c.undecided(p.ctxs[i], "check", p.reqs[i], in.Checks[j].IdempotencyKey, err)
		}
		return
	}
	if r.status != http.StatusOK {
		e := errorOf(r)
		if e.StatusCode == http.StatusBadRequest || e.StatusCode == http.StatusRequestEntityTooLarge ||
			e.StatusCode == http.StatusUnprocessableEntity {
			alone(live)
			return
		}
		for _, i := range live {
			p.outs[i].err = e
		}
		return
	}
	answers, err := batchAnswers(r, len(live))
	if err != nil {
		for _, i := range live {
			p.outs[i].err = err
		}
		return
	}
	now := time.Now()
	var again []int
	for j, i := range live {
		a := &answers[j]
		if e := a.problem; e != nil {
			if e.StatusCode >= 500 { // not counted: its check of its own, with the same key, counts it once at most
				if !p.reqs[i].Query {
					p.reqs[i].IdempotencyKey = in.Checks[j].IdempotencyKey
				}
				again = append(again, i)
			} else {
				p.outs[i].err = e
			}
			continue
		}
		res := a.answer.result(in.Checks[j].IdempotencyKey, now)
		p.outs[i].res = res
		c.decided(p.ctxs[i], DecisionInfo{Op: "check", Request: p.reqs[i], Allowed: res.Allowed, Mode: res.Mode, Warning: res.Warning})
	}
	alone(again)
}
