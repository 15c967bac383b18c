package quota_test

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A bucket whose burst is lowered below its tokens holds at most the lower burst;
// a rate raised reads the same debt in microseconds.
func TestBucketLimitChanges(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	if !r.MustCheck(t, userBucket(org, 5, bucket(vocab.Second, 10, 100))).Allowed {
		t.Fatal("5 of 100 refused")
	}
	lv := levelOf(t, r.MustCheck(t, userBucket(org, 0, bucket(vocab.Second, 10, 3))), vocab.LevelUser, vocab.Second)
	t.Logf("burst lowered to 3 with 95 tokens: %+v", lv)
	if lv.Remaining < 0 || lv.Remaining > 3 {
		t.Errorf("remaining %d of burst 3", lv.Remaining)
	}
	// empty a 100-burst bucket, lower burst to 10: a warn check must not give tokens
	org2 := testenv.ID(t, "o2")
	if !r.MustCheck(t, userBucket(org2, 100, bucket(vocab.Second, 10, 100))).Allowed {
		t.Fatal("100 of 100 refused")
	}
	warn := userBucket(org2, 1, bucket(vocab.Second, 10, 10))
	warn.Mode = vocab.Warn
	r.MustCheck(t, warn)
	clk.Add(2 * time.Second) // 20 tokens of the 100 owed come back: still 80 owed
	res := r.MustCheck(t, userBucket(org2, 1, bucket(vocab.Second, 10, 10)))
	t.Logf("after warn + 2s: %+v", res)
	if res.Allowed {
		t.Errorf("a warn check forgave the debt of a lowered burst")
	}
}
