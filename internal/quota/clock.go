package quota

import (
	"context"
	"sync/atomic"
	"time"
)

// The engine's clock. Every decision and expiry that depends on time (window buckets,
// billing periods, lease and reservation expiry, the reservation sweep) reads
// Engine.Now: the last Redis TIME sample plus the time elapsed since it was taken, on
// the local monotonic clock. The local wall clock is never read for a decision, so a
// step of it (NTP, a resumed VM, an operator's date) changes nothing; replicas agree
// to within their samples' round trips and their monotonic clocks' drift over the
// sampling interval (docs/ARCHITECTURE.md, "Time").

// maxDrift bounds how fast a local monotonic clock may run apart from Redis's:
// 500 ppm, the most NTP slews a Linux clock (crystals drift some 10-50 ppm).
const maxDrift = 500e-6

// clockSample is one reading of Redis TIME and the local clock's readings at the
// middle of its round trip, where Redis most likely read its clock.
type clockSample struct {
	redis time.Time     // Redis TIME (no monotonic reading)
	local time.Time     // Config.Clock at the middle of the round trip
	mono  time.Duration // Config.Monotonic there, when it is set
	rtt   time.Duration // the round trip: the sample is right to within rtt/2
}

// Now is the engine's clock: the last Redis TIME sample plus the time elapsed since,
// measured on the monotonic clock. Until a first sample (Redis down since New) it is
// the local clock. It takes no lock and allocates nothing.
func (e *Engine) Now() time.Time {
	s := e.clock.Load()
	if s == nil {
		return e.cfg.now()
	}
	return s.redis.Add(e.since(s))
}

// since is the time elapsed since sample s, on the monotonic clock.
func (e *Engine) since(s *clockSample) time.Duration {
	switch {
	case e.cfg.Monotonic != nil:
		return e.cfg.Monotonic() - s.mono
	case e.cfg.Clock == nil:
		return time.Since(s.local) // the monotonic reading alone: no wall clock read
	}
	return e.cfg.Clock().Sub(s.local)
}

// now reads Clock, time.Now when it is nil.
func (c *Config) now() time.Time {
	if c.Clock == nil {
		return time.Now()
	}
	return c.Clock()
}

// readLocal reads the local clock (its monotonic reading too, when configured apart).
func (e *Engine) readLocal() (time.Time, time.Duration) {
	var m time.Duration
	if e.cfg.Monotonic != nil {
		m = e.cfg.Monotonic()
	}
	return e.cfg.now(), m
}

// syncClock samples Redis TIME. A sample replaces the one kept unless its round trip
// leaves it less certain than the kept one has become (half its round trip plus the
// most the monotonic clock can have drifted since): one slow reply does not move the
// clock by half of it.
func (e *Engine) syncClock(ctx context.Context) error {
	t0, m0 := e.readLocal()
	rt, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	t1, m1 := e.readLocal()
	rtt := t1.Sub(t0)
	if e.cfg.Monotonic != nil {
		rtt = m1 - m0
	}
	s := &clockSample{redis: rt, local: t0.Add(rtt / 2), mono: m0 + rtt/2, rtt: rtt}
	if old := e.clock.Load(); old != nil {
		age := e.since(old)
		if rtt/2 > old.rtt/2+time.Duration(float64(age.Abs())*maxDrift) {
			return nil
		}
	}
	e.clock.Store(s)
	return nil
}

// StepClock is a local clock whose wall reading can be stepped, as NTP or a resumed
// VM steps a host's, while its monotonic reading runs on: the clock fault of the
// binaries (QUOTA_FAULT_CLOCK, internal/platform/faultclock) and of tests. Use sets
// it as an engine's Clock and Monotonic. It is safe for concurrent use.
type StepClock struct {
	origin time.Time
	step   atomic.Int64 // ns
}

// NewStepClock returns a StepClock reading the local clock, not stepped.
func NewStepClock() *StepClock { return &StepClock{origin: time.Now()} }

// Now is the wall reading: the local clock plus the steps so far.
func (c *StepClock) Now() time.Time { return time.Now().Add(time.Duration(c.step.Load())) }

// Monotonic is the monotonic reading: the time since NewStepClock, never stepped.
func (c *StepClock) Monotonic() time.Duration { return time.Since(c.origin) }

// Step steps the wall reading by d and returns the total step.
func (c *StepClock) Step(d time.Duration) time.Duration { return time.Duration(c.step.Add(int64(d))) }

// Use makes c the clock source of engines configured by cfg.
func (c *StepClock) Use(cfg *Config) { cfg.Clock, cfg.Monotonic = c.Now, c.Monotonic }
