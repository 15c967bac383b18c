// Package faultclock is the clock-step fault hook of the binaries, a test hook off by
// default: with QUOTA_FAULT_CLOCK=on, the api and the worker run their engines on a
// clock whose wall reading can be stepped (quota.StepClock, which they create and pass
// to Install), and SIGUSR1 steps it by +2 s, SIGUSR2 by -2 s (cumulative), each logged
// as a JSON line "clock stepped". A fault driver (internal/faulttest) uses it to show
// that a stepped clock changes no decision. Without the variable the binaries call
// nothing here: no signal handler is installed and the engines read time.Now.
package faultclock

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Env is the variable that turns the hook on (value "on").
const Env = "QUOTA_FAULT_CLOCK"

// StepSize is how far one signal steps the clock.
const StepSize = 2 * time.Second

// Stepper is a clock whose wall reading can be stepped: Step steps it by d and returns
// the total step so far. *quota.StepClock is one.
type Stepper interface {
	Step(d time.Duration) time.Duration
}

// Install steps c on SIGUSR1 (+2 s) and SIGUSR2 (-2 s) until ctx ends. Call it only
// when the hook is on (config.Common.FaultClock, from Env), with the clock the engines
// use (quota.StepClock's Use on their quota.Config).
func Install(ctx context.Context, c Stepper, log *slog.Logger) {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	log.Warn("clock fault hook on: SIGUSR1 steps the engine's wall clock +2s, SIGUSR2 -2s", "env", Env)
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case s := <-sig:
				d := StepSize
				if s == syscall.SIGUSR2 {
					d = -StepSize
				}
				total := c.Step(d)
				log.Warn("clock stepped", "by", d.String(), "step", total.String(), "step_ms", total.Milliseconds())
			}
		}
	}()
}
