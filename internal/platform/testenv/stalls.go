package testenv

import (
	"sync"
	"testing"
	"time"
)

// StallWatch records when the test process did not run: a goroutine that asks to
// wake every stallTick notes each wake-up at least StallMin late. On a loaded 2-core
// machine (race-detector builds of other packages compiling beside the tests) a
// process is at times descheduled for whole seconds. Fault tests assert timing
// bounds (a breaker that opens within a second, answers within a Redis timeout); a
// bound broken during such a stall measures the machine, not the code, so they
// subtract the stall time an interval overlaps, and report both figures.
type StallWatch struct {
	mu    sync.Mutex
	spans []span
}

type span struct{ from, to time.Time }

const stallTick = 2 * time.Millisecond

// StallMin is the shortest delay of a wake-up recorded as a stall: well above the
// timer's own slack, well below the bounds the fault tests assert.
const StallMin = 20 * time.Millisecond

// WatchStalls starts watching; the watch ends with the test.
func WatchStalls(tb testing.TB) *StallWatch {
	s := &StallWatch{}
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		last := time.Now()
		for {
			select {
			case <-done:
				return
			default:
			}
			time.Sleep(stallTick)
			now := time.Now()
			if now.Sub(last)-stallTick >= StallMin {
				s.mu.Lock()
				s.spans = append(s.spans, span{last.Add(stallTick), now})
				s.mu.Unlock()
			}
			last = now
		}
	}()
	tb.Cleanup(func() { close(done); <-stopped })
	return s
}

// Within returns how long the process stalled between from and to.
func (s *StallWatch) Within(from, to time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d time.Duration
	for _, sp := range s.spans {
		lo, hi := maxTime(sp.from, from), minTime(sp.to, to)
		if hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

// Longest returns the longest single stall recorded so far, and how many there were.
func (s *StallWatch) Longest() (time.Duration, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d time.Duration
	for _, sp := range s.spans {
		d = max(d, sp.to.Sub(sp.from))
	}
	return d, len(s.spans)
}

// Running returns how long the process ran (was not stalled) between from and to.
func (s *StallWatch) Running(from, to time.Time) time.Duration {
	return to.Sub(from) - s.Within(from, to)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
