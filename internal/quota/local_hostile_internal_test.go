package quota

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The local fail mode's bucket with hostile numbers: a burst whose refill is longer
// than a time.Duration holds (292 years), a cost of 2^50: never more than the burst,
// nor than 2^52 us of debt (as on Redis).
func TestLocalTokenBucketHostileNumbers(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		w            vocab.Window
		limit, burst int64
	}{{vocab.Day, 1, 1 << 50}, {vocab.Day, 1, 1_000_000}, {vocab.Second, 1 << 50, 1 << 50}, {vocab.Day, 3, 1 << 40}} {
		l := newLocalLimiter(1)
		req := func(cost int64) *Request {
			return &Request{Org: "o", Team: "t", User: "u", Metric: "requests", Cost: cost,
				Limits: LevelLimits{User: []vocab.Limit{{Window: c.w, Limit: c.limit, Burst: c.burst}}}}
		}
		n := 0
		for range 5 {
			if l.decide(req(1), now).Allowed {
				n++
			}
		}
		if n != 5 {
			t.Errorf("%+v: a full bucket admitted %d of 5 single units", c, n)
		}
		res := l.decide(req(c.burst), now)
		lv := res.Levels[0]
		t.Logf("%+v: cost = burst after 5: %v remaining %d used %d retry %v", c, res.Allowed, lv.Remaining, lv.Used, res.RetryAfter)
		if res.Allowed {
			t.Errorf("%+v: the whole burst admitted after 5 units", c)
		}
		// at most 2^52 us of debt: 1/day holds 52,124 tokens
		per := max(c.w.Duration()/time.Duration(c.limit), 1)
		depth := min(c.burst, int64(time.Duration(1<<52)*time.Microsecond/per))
		if lv.Remaining != depth-5 || lv.Used != c.burst-lv.Remaining {
			t.Errorf("%+v: level %+v, want %d remaining", c, lv, depth-5)
		}
		res = l.decide(req(depth-5), now)
		if !res.Allowed {
			t.Errorf("%+v: the rest of the burst refused: %+v", c, res)
		}
		if res = l.decide(req(1), now); res.Allowed {
			t.Errorf("%+v: an empty bucket admitted 1: %+v", c, res)
		}
	}
}
