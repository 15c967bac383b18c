package testenv

import (
	"sync"
	"time"
)

// Clock is a time source a test moves by hand (expiry, sliding windows), safe for
// concurrent use: pass its Now where code takes a func() time.Time. It has a wall and
// a monotonic reading, as a host's clock has: Add is time passing (both move), Step
// is the wall clock stepped (NTP, a resumed VM: the monotonic reading stays). An
// engine given both (quota.Config{Clock: c.Now, Monotonic: c.Monotonic}) follows Add
// and ignores Step.
type Clock struct {
	mu      sync.Mutex
	now     time.Time     // the wall reading
	elapsed time.Duration // the monotonic reading: the sum of Add
}

// NewClock returns a Clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{now: t} }

// Now returns the clock's wall time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

// Monotonic returns the clock's monotonic reading: the time Add has moved it.
func (c *Clock) Monotonic() time.Duration { c.mu.Lock(); defer c.mu.Unlock(); return c.elapsed }

// Add moves the clock by d: time passes.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.elapsed += d
}

// Step steps the wall reading by d; the monotonic reading does not move.
func (c *Clock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
