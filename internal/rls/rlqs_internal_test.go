package rls

import (
	"math"
	"testing"
	"time"
)

// A token bucket assignment admits at most its lease's units over its TTL and slack,
// continuously refilled from full; it admits nearly all of them when used so long (the
// fill interval is rounded up to the millisecond, on the safe side); and a
// reassignment is never the same strategy as the one before.
func TestBucketStrategyWorstCaseIsTheLease(t *testing.T) {
	for _, ttl := range []time.Duration{5 * time.Millisecond, 90 * time.Millisecond, time.Second, 2 * time.Second, 10 * time.Second} {
		for units := int64(1); units <= 5000; units += 1 + units/7 {
			s, life := bucketStrategy(units, ttl, 0)
			tb := s.GetTokenBucket()
			if life < ttl+max(ttl/4, 50*time.Millisecond) {
				t.Fatalf("units %d ttl %v: life %v shorter than the TTL and its slack", units, ttl, life)
			}
			fill := tb.GetFillInterval().AsDuration()
			worst := float64(tb.GetMaxTokens()) + float64(tb.GetTokensPerFill().GetValue())*life.Seconds()/fill.Seconds()
			if got := int64(math.Floor(worst)); got > units || float64(got) < 0.97*float64(units)-1 {
				t.Errorf("units %d ttl %v: max_tokens %d, %d per %v: admits %.3f over %v, want at most %d and at least 97 %%",
					units, ttl, tb.GetMaxTokens(), tb.GetTokensPerFill().GetValue(), fill, worst, life, units)
			}
			if again, _ := bucketStrategy(units, ttl, fill); again.GetTokenBucket().GetFillInterval().AsDuration() == fill {
				t.Errorf("units %d ttl %v: the same strategy twice", units, ttl)
			}
		}
	}
}
