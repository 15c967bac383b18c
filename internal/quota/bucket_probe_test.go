package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// One metric's bucket beside another's sliding window of the same window, all or
// nothing; a bucket at org and at user in the same window; precise windows with a
// bucket; shadow past the burst; a reservation committed by the sweep.
func TestBucketProbes(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	ctx := context.Background()

	t.Run("metrics", func(t *testing.T) {
		org := testenv.ID(t, "o")
		b, w := bucket(vocab.Second, 10, 5), lim(vocab.Second, 100)
		two := func(nreq, ntok int64, precise bool) quota.Request {
			q := userBucket(org, nreq, b)
			q.Precise = precise
			q.More = []quota.MetricCost{{Metric: "tokens", Cost: ntok, Limits: quota.LevelLimits{User: []vocab.Limit{w}}}}
			return q
		}
		for _, precise := range []bool{false, true} {
			clk.Add(10 * time.Second)
			if res := r.MustCheck(t, two(1, 90, precise)); !res.Allowed {
				t.Fatalf("first: %+v", res)
			}
			if res := r.MustCheck(t, two(1, 20, precise)); res.Allowed || res.BlockedAt.Metric != "tokens" {
				t.Fatalf("over the window: %+v", res)
			}
			if res := r.MustCheck(t, two(5, 1, precise)); res.Allowed || res.BlockedAt.Metric != "requests" {
				t.Fatalf("over the bucket: %+v", res)
			}
			res := r.MustCheck(t, two(0, 0, precise))
			for _, l := range res.Levels {
				if l.Metric == "requests" && l.Remaining != 4 || l.Metric == "tokens" && l.Used != 90 {
					t.Errorf("precise %v: after refusals: %+v", precise, l)
				}
			}
		}
	})

	t.Run("org and user", func(t *testing.T) {
		org := testenv.ID(t, "o")
		q := func(user string) quota.Request {
			return quota.Request{Org: org, Team: "eng", User: user, Metric: "requests", Cost: 1,
				Limits: quota.LevelLimits{Org: []vocab.Limit{bucket(vocab.Second, 10, 5)}, User: []vocab.Limit{bucket(vocab.Second, 10, 3)}}}
		}
		n := map[string]int{}
		for range 4 {
			for _, u := range []string{"a", "b"} {
				if r.MustCheck(t, q(u)).Allowed {
					n[u]++
				}
			}
		}
		if n["a"]+n["b"] != 5 || n["a"] > 3 || n["b"] > 3 {
			t.Errorf("admitted %v, want 5 in all, 3 each at most", n)
		}
		res := r.MustCheck(t, q("a"))
		if res.Allowed || res.RetryAfter != 100*time.Millisecond {
			t.Errorf("refusal: %+v", res)
		}
	})

	t.Run("shadow past burst", func(t *testing.T) {
		org := testenv.ID(t, "o")
		req := userBucket(org, 50, bucket(vocab.Second, 10, 5))
		req.Mode = vocab.Shadow
		res := r.MustCheck(t, req)
		lv := levelOf(t, res, vocab.LevelUser, vocab.Second)
		if !res.Allowed || res.WouldBlock == nil || res.RetryAfter != 0 || lv.Remaining != 0 || lv.Used != 5 {
			t.Errorf("shadow cost 50 of burst 5: %+v", res)
		}
		clk.Add(500 * time.Millisecond)
		if lv := levelOf(t, r.MustCheck(t, userBucket(org, 0, bucket(vocab.Second, 10, 5))), vocab.LevelUser, vocab.Second); lv.Remaining != 5 {
			t.Errorf("half a second after: %+v", lv)
		}
	})

	t.Run("sweep commits", func(t *testing.T) {
		org := testenv.ID(t, "o")
		b := bucket(vocab.Hour, 3600, 100)
		r.mustReserve(t, userBucket(org, 60, b), quota.ReserveOptions{TTL: 2 * time.Second, OnExpiry: vocab.ExpiryCommit})
		clk.Add(10 * time.Second)
		if _, err := r.e.SweepReservations(ctx); err != nil {
			t.Fatal(err)
		}
		if lv := levelOf(t, r.MustCheck(t, userBucket(org, 0, b)), vocab.LevelUser, vocab.Hour); lv.Remaining != 50 {
			t.Errorf("after a committed expiry 10 s on: %+v, want 50", lv)
		}
		if res, _, err := r.e.Reserve(ctx, userBucket(org, 101, b), quota.ReserveOptions{}); err != nil || res.ID != "" {
			t.Errorf("a reservation above the burst: %+v %v", res, err)
		}
	})
}
