package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A bucket whose burst takes more than 2^52 us to refill (1/day, burst 100,000: 274
// years) never admits more than its burst at once: the debt's cap at 2^52 us must
// not forgive the units above it.
func TestBucketHugeRefillNeverPastBurst(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	b := bucket(vocab.Day, 1, 100_000)
	var got int64
	for range 30 {
		if r.MustCheck(t, userBucket(org, 10_000, b)).Allowed {
			got += 10_000
		}
	}
	if got > 100_000 {
		t.Errorf("admitted %d units at one instant, burst 100,000", got)
	}
	// 50,000 taken of the 52,124 the bucket can hold (2^52 us / T, T = a day); a day
	// later one more token: 2,125 fit, 2,126 never do at once.
	clk.Add(24 * time.Hour)
	if r.MustCheck(t, userBucket(org, 2_126, b)).Allowed {
		t.Errorf("2,126 admitted a day after 50,000 of a bucket that holds 52,124")
	}
	if !r.MustCheck(t, userBucket(org, 2_125, b)).Allowed {
		t.Errorf("2,125 refused a day after 50,000 of a bucket that holds 52,124")
	}
	if res := r.MustCheck(t, userBucket(org, 1, b)); res.Allowed || res.RetryAfter != 372_630*time.Millisecond {
		t.Errorf("an empty bucket at 1/day: %+v, want refused, retry 6m12.63s (52,125 T - 2^52 us)", res)
	}
}

// Hostile extremes: burst 2^50 at 1/day, limit 2^50 a second, cost 2^50.
func TestBucketHostileNumbers(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	const p50 = int64(1) << 50
	b := bucket(vocab.Day, 1, p50)
	// A bucket holds at most 2^52 us of debt: 52,124 days' tokens at 1/day. A cost
	// above that never fits; the level says 52,124 remain.
	res := r.MustCheck(t, userBucket(org, p50, b))
	if lv := levelOf(t, res, vocab.LevelUser, vocab.Day); res.Allowed || res.RetryAfter != 0 || lv.Remaining != 52_124 || lv.Used != p50-52_124 {
		t.Fatalf("2^50 of a bucket of 2^50 at 1/day: %+v, want refused for ever, 52,124 remaining", res)
	}
	res = r.MustCheck(t, userBucket(org, 52_124, b))
	if lv := levelOf(t, res, vocab.LevelUser, vocab.Day); !res.Allowed || lv.Remaining != 0 || lv.Used != p50 {
		t.Fatalf("52,124 of a full bucket: %+v", res)
	}
	if !levelOf(t, res, vocab.LevelUser, vocab.Day).ResetAt.Equal(clk.Now().Add(52_124 * 24 * time.Hour).Truncate(time.Millisecond).Add(time.Millisecond)) {
		t.Logf("reset %v", levelOf(t, res, vocab.LevelUser, vocab.Day).ResetAt)
	}
	res = r.MustCheck(t, userBucket(org, 1, b))
	if res.Allowed || res.RetryAfter != 372_630*time.Millisecond {
		t.Errorf("an emptied bucket of 2^50: %+v, want refused, retry 6m12.63s (52,125 T - 2^52 us)", res)
	}
	// limit 2^50 a second: T < 1 us
	org2 := testenv.ID(t, "o2")
	b2 := bucket(vocab.Second, p50, 1)
	n := 0
	for range 5 {
		if r.MustCheck(t, userBucket(org2, 1, b2)).Allowed {
			n++
		}
	}
	t.Logf("burst 1 at 2^50/s, same instant: %d admitted", n)
	if n != 1 {
		t.Errorf("burst 1 admitted %d at one instant", n)
	}
	res = r.MustCheck(t, userBucket(org2, 1, b2))
	t.Logf("retry: %v", res.RetryAfter)
	clk.Add(time.Millisecond)
	if !r.MustCheck(t, userBucket(org2, 1, b2)).Allowed {
		t.Errorf("a ms later still refused")
	}
	// cost 0 on an empty bucket
	res = r.MustCheck(t, userBucket(org, 0, b))
	if !res.Allowed {
		t.Errorf("cost 0 on an empty bucket refused: %+v", res)
	}
}

// A reservation expired by the sweep gives back its tokens, never above the burst.
func TestBucketReservationExpiresThroughSweep(t *testing.T) {
	t.Parallel()
	clk := newClock()
	r := MustRig(t, "", quota.BucketsOnEngineClock(quota.Config{Clock: clk.Now}))
	org := testenv.ID(t, "o")
	b := bucket(vocab.Hour, 3600, 100)
	ctx := context.Background()
	r.mustReserve(t, userBucket(org, 60, b), quota.ReserveOptions{TTL: 2 * time.Second, OnExpiry: vocab.ExpiryRelease})
	_ = ctx
	clk.Add(10 * time.Second)
	if _, err := r.e.SweepReservations(ctx); err != nil {
		t.Fatal(err)
	}
	lv := levelOf(t, r.MustCheck(t, userBucket(org, 0, b)), vocab.LevelUser, vocab.Hour)
	if lv.Remaining != 100 {
		t.Errorf("after a released expiry: %+v, want 100", lv)
	}
}
