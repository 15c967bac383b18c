package quota

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// ErrAway is returned to background polls (the worker's flush and reservation sweep,
// PollEngine) of an org's dedicated Redis that failed and is in its backoff: the poll
// is skipped, not tried, until the backoff ends. It is no failure of its own, so
// callers skip it without logging (the failure that started the backoff was).
var ErrAway = derrors.New(derrors.Unavailable, "quota: the org's dedicated Redis is away; polls of it back off")

// PollBackoff spaces the background polls of a dedicated Redis that fails, so an
// unreachable org redis_url is not polled, and warned about, several times a second.
// After the n-th failure in a row the Redis is not polled for Min * 2^(n-1), at most
// Max; a success ends the backoff. The zero value is usable.
type PollBackoff struct {
	Min time.Duration // the first pause (default 1 s)
	Max time.Duration // the longest pause (default 1 min)
}

func (p *PollBackoff) setDefaults() {
	if p.Min <= 0 {
		p.Min = time.Second
	}
	if p.Max <= 0 {
		p.Max = time.Minute
	}
	p.Max = max(p.Max, p.Min)
}

// pollState is the backoff of one dedicated Redis.
type pollState struct {
	mu    sync.Mutex
	fails int
	until time.Time
}

// ready returns nil when the Redis may be polled at now, else an error wrapping
// ErrAway that says when it will be.
func (s *pollState) ready(now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Before(s.until) {
		return fmt.Errorf("%w (next try in %s)", ErrAway, s.until.Sub(now).Round(time.Second))
	}
	return nil
}

// done records the outcome of a poll: an unavailable Redis starts or lengthens the
// backoff, and the error returned says so (the caller logs it: at most once per
// pause); anything else ends it.
func (s *pollState) done(err error, now time.Time, cfg PollBackoff) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil || !(errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)) {
		s.fails, s.until = 0, time.Time{}
		return err
	}
	s.fails++
	wait := cfg.Min
	for i := 1; i < s.fails && wait < cfg.Max; i++ {
		wait *= 2
	}
	wait = min(wait, cfg.Max)
	s.until = now.Add(wait)
	return fmt.Errorf("%w (dedicated Redis: %d failed polls in a row, next try in %s)", err, s.fails, wait)
}

// PollEngine is EngineFor for background polls (the worker's flush): on an org's
// dedicated Redis that failed and is in its backoff, it returns an error wrapping
// ErrAway at once. done must be called with the poll's error: a failure because the
// Redis is unavailable starts or lengthens the backoff (its returned error says so;
// log that one), a success ends it. A pool's Redis (default or class) has no backoff:
// done returns its error as is.
func (r *Engines) PollEngine(route vocab.Route) (*Engine, func(error) error, error) {
	b, err := r.backendFor(r.urlOf(&route))
	if err != nil {
		return nil, nil, err
	}
	if b.name != DedicatedPool {
		return b.eng, func(err error) error { return err }, nil
	}
	if err := b.poll.ready(time.Now()); err != nil {
		return nil, nil, err
	}
	return b.eng, func(err error) error { return b.poll.done(err, time.Now(), r.cfg.PollBackoff) }, nil
}
