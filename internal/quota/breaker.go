package quota

import (
	"context"
	"errors"
	"time"

	"github.com/sony/gobreaker/v2"
)

// BreakerConfig tunes the circuit breaker of each Redis. The zero value is usable.
type BreakerConfig struct {
	// ConsecutiveFailures opens the breaker after this many failures in a row (default 5).
	ConsecutiveFailures uint32
	// FailureRatio opens the breaker when at least this fraction of the checks of the
	// last Interval failed, once MinRequests were seen (default 0.5).
	FailureRatio float64
	// MinRequests is the number of checks within Interval below which FailureRatio
	// is not applied (default 20).
	MinRequests uint32
	// Interval is the rolling window of the failure ratio while closed (default 10 s).
	Interval time.Duration
	// OpenTimeout is how long the breaker stays open before letting probes through
	// (half-open) (default 1 s).
	OpenTimeout time.Duration
	// HalfOpenProbes is how many checks may probe Redis while half-open; that many
	// successes in a row close the breaker, one failure opens it again (default 1).
	HalfOpenProbes uint32
}

func (b *BreakerConfig) setDefaults() {
	if b.ConsecutiveFailures == 0 {
		b.ConsecutiveFailures = 5
	}
	if b.FailureRatio <= 0 || b.FailureRatio > 1 {
		b.FailureRatio = 0.5
	}
	if b.MinRequests == 0 {
		b.MinRequests = 20
	}
	if b.Interval <= 0 {
		b.Interval = 10 * time.Second
	}
	if b.OpenTimeout <= 0 {
		b.OpenTimeout = time.Second
	}
	if b.HalfOpenProbes == 0 {
		b.HalfOpenProbes = 1
	}
}

// breaker is a circuit breaker of one Redis, or of one primary of a cluster.
type breaker = gobreaker.TwoStepCircuitBreaker[struct{}]

func (b *backend) newBreaker(name string) *breaker {
	bc := b.breakers
	return gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         name,
		MaxRequests:  bc.HalfOpenProbes,
		Interval:     bc.Interval,
		BucketPeriod: bc.Interval / 10,
		Timeout:      bc.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= bc.ConsecutiveFailures ||
				c.Requests >= bc.MinRequests && float64(c.TotalFailures) >= bc.FailureRatio*float64(c.Requests)
		},
		IsSuccessful: func(err error) bool { return !isRedisFailure(err) },
		IsExcluded:   isExcluded,
	})
}

// breakerFor returns the breaker guarding org's checks. On a cluster each primary
// has its own: a dead primary degrades the orgs whose slots it holds, not the
// others. After a failover the slot's new primary starts with a closed breaker.
func (b *backend) breakerFor(org string) *breaker {
	if b.cluster == nil {
		return b.cb
	}
	m, err := b.cluster.MasterForKey(context.Background(), "{"+org+"}")
	if err != nil {
		return b.cb // no slot map yet: the whole cluster's breaker
	}
	addr := m.Options().Addr
	if v, ok := b.shards.Load(addr); ok {
		return v.(*breaker)
	}
	v, _ := b.shards.LoadOrStore(addr, b.newBreaker(b.name+"@"+addr))
	return v.(*breaker)
}

// isRedisFailure reports whether err says Redis did not answer: only these count
// against the breaker (not ErrInvalid, not a hydrator's error).
func isRedisFailure(err error) bool {
	return err != nil && (errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded))
}

// isExcluded reports whether err says nothing of Redis (its caller went away, or the
// engine closed): the breaker leaves such a check out of its counts.
func isExcluded(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, ErrClosed)
}

func isBreakerRejection(err error) bool {
	return errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests)
}
