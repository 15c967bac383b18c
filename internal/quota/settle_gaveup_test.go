package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A reservation whose commit gave up (its replica lost Redis, or died, before the
// commit ran) is settled by its on_expiry as its caller chose: with commit (the
// default) the whole amount is counted, at least what was used, so nothing admitted
// under it is lost; with release everything goes back, the caller's choice (it was
// told the commit failed, and a commit may be repeated until expires_at).
func TestReservationWhoseCommitGaveUp(t *testing.T) {
	prefix := testenv.ID(t, "qg")
	survivor := MustRig(t, "", quota.Config{KeyPrefix: prefix})
	limits := quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1000)}}
	for _, onExp := range []vocab.OnExpiry{vocab.ExpiryCommit, vocab.ExpiryRelease} {
		t.Run(string(onExp), func(t *testing.T) {
			org := "org-" + string(onExp)
			dying := MustRig(t, "", quota.Config{KeyPrefix: prefix})
			res := dying.mustReserve(t, reserveReq(org, 40, limits), quota.ReserveOptions{TTL: 200 * time.Millisecond, OnExpiry: onExp})
			_ = dying.rdb.Close() // Redis gone for this replica: its commit gives up
			if _, err := dying.e.Commit(context.Background(), org, 1, res.ID, 25); err == nil {
				t.Fatal("a commit over a closed client succeeded")
			}
			time.Sleep(250 * time.Millisecond)
			if _, err := survivor.e.SweepReservations(context.Background()); err != nil {
				t.Fatal(err)
			}
			r, err := survivor.e.Reservation(context.Background(), org, 1, res.ID)
			if err != nil {
				t.Fatal(err)
			}
			got := survivor.usage(t, org)[userC("tokens", "eng", "alice")]
			want := int64(40)
			if onExp == vocab.ExpiryRelease {
				want = 0
			}
			t.Logf("on_expiry %s: %s, used %d, counted %d", onExp, r.State, r.Used, got)
			if r.State != vocab.Expired || got != want {
				t.Errorf("after the commit gave up: %s, counted %d, want expired and %d", r.State, got, want)
			}
		})
	}
}
