package quota

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// While Redis is out, a FailLocal replica decides a token bucket as a bucket of its
// share of the rate and the burst (2 replicas: 5/s, burst 15 of 10/s, burst 30):
// the burst at once, then the rate, a refusal's retry to the next token, a cost above
// the share of the burst never, and the level says so.
func TestLocalTokenBucket(t *testing.T) {
	l := newLocalLimiter(2)
	now := time.Unix(1_800_000_000, 0)
	req := func(cost int64) *Request {
		return &Request{Org: "o", Team: "t", User: "u", Metric: "requests", Cost: cost,
			Limits: LevelLimits{User: []vocab.Limit{{Window: vocab.Second, Limit: 10, Burst: 30}}}}
	}
	n := 0
	for range 40 {
		if l.decide(req(1), now).Allowed {
			n++
		}
	}
	if n != 15 {
		t.Fatalf("admitted %d at once, want the share of the burst, 15", n)
	}
	res := l.decide(req(1), now)
	if res.Allowed || res.RetryAfter != 200*time.Millisecond {
		t.Errorf("over the bucket: %+v, want denied, retry 200ms (5/s)", res)
	}
	lv := res.Levels[0]
	if lv.Burst != 15 || lv.Limit != 5 || lv.Remaining != 0 || lv.Used != 15 || !lv.ResetAt.Equal(now.Add(3*time.Second)) {
		t.Errorf("level = %+v", lv)
	}
	now = now.Add(time.Second)
	n = 0
	for range 40 {
		if l.decide(req(1), now).Allowed {
			n++
		}
	}
	if n != 5 {
		t.Errorf("admitted %d a second later, want the share of the rate, 5", n)
	}
	if res := l.decide(req(16), now.Add(time.Hour)); res.Allowed || res.RetryAfter != 0 {
		t.Errorf("a cost above the share of the burst: %+v, want denied without retry", res)
	}
	if res := l.decide(req(15), now.Add(time.Hour)); !res.Allowed || res.Levels[0].Remaining != 0 {
		t.Errorf("a full bucket's whole share: %+v", res)
	}
}

// A warn check on a bucket whose burst was lowered below its debt keeps the debt: a
// forced check never gives tokens back.
func TestLocalTokenBucketForcedKeepsDebt(t *testing.T) {
	l := newLocalLimiter(1)
	now := time.Unix(1_800_000_000, 0)
	req := func(cost, burst int64, mode vocab.Mode) *Request {
		return &Request{Org: "o", Team: "t", User: "u", Metric: "requests", Cost: cost, Mode: mode,
			Limits: LevelLimits{User: []vocab.Limit{{Window: vocab.Second, Limit: 10, Burst: burst}}}}
	}
	if !l.decide(req(100, 100, vocab.Enforce), now).Allowed {
		t.Fatal("a full bucket of 100 refused 100")
	}
	l.decide(req(1, 10, vocab.Warn), now)
	if res := l.decide(req(1, 10, vocab.Enforce), now.Add(2*time.Second)); res.Allowed {
		t.Errorf("2 s after emptying 100 at 10/s (80 owed), burst lowered to 10: %+v, want refused", res)
	}
}
