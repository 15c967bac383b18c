package tenants_test

import (
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func TestThrottleApply(t *testing.T) {
	half := tenants.Throttle{PPM: 500_000}
	cases := []struct {
		name  string
		th    tenants.Throttle
		w     vocab.Window
		limit int64
		want  int64
	}{
		{"none", tenants.Throttle{}, vocab.Minute, 100, 100},
		{"half", half, vocab.Minute, 100, 50},
		{"rounds down", half, vocab.Second, 3, 1},
		{"down to 0", tenants.Throttle{PPM: 1}, vocab.Day, 999_999, 0},
		{"0 stays 0", half, vocab.Hour, 0, 0},
		{"exact where a float is not", tenants.Throttle{PPM: 290_000}, vocab.Minute, 100, 29},
		{"largest limit, no overflow", tenants.Throttle{PPM: 999_999}, vocab.Minute, 1 << 53, 9007190247541737},
		{"factor 1", tenants.Throttle{PPM: 1_000_000}, vocab.Minute, 7, 7},
		{"month untouched", half, vocab.Month, 1000, 1000},
		{"month asked for", tenants.Throttle{PPM: 500_000, Month: true}, vocab.Month, 1001, 500},
	}
	for _, tc := range cases {
		if got := tc.th.Apply(tc.w, tc.limit); got != tc.want {
			t.Errorf("%s: Apply(%s, %d) = %d, want %d", tc.name, tc.w, tc.limit, got, tc.want)
		}
	}
}

func TestThrottleOfPicksTheSmallerActive(t *testing.T) {
	now := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	org := tenants.Throttle{Scope: tenants.ThrottleOrg, PPM: 800_000, ExpiresAt: now.Add(time.Minute)}
	plan := tenants.Throttle{Scope: tenants.ThrottlePlan, PPM: 300_000, ExpiresAt: now.Add(time.Second)}
	r := tenants.ResolvedOrg{Throttles: []tenants.Throttle{org, plan}}
	if got, ok := r.ThrottleOf(now); !ok || got.Scope != tenants.ThrottlePlan {
		t.Errorf("both active: %+v %v, want the plan's", got, ok)
	}
	if got, ok := r.ThrottleOf(now.Add(time.Second)); !ok || got.Scope != tenants.ThrottleOrg {
		t.Errorf("the plan's expired: %+v %v, want the org's", got, ok)
	}
	if got, ok := r.ThrottleOf(now.Add(time.Minute)); ok {
		t.Errorf("both expired: %+v", got)
	}
}
