package checks_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A batch decides each check on its own, in order: a check the service refuses is
// that item's error, the others go to the engine in one Decide call (in the batch's
// order) and are described as Check describes them; an engine error is its item's
// alone, of Check's kinds.
func TestCheckBatch(t *testing.T) {
	w := newWorld(t)
	// The fake denies team ops at its month (retry in 2.5 s), fails user bob's checks
	// as the quota store down and allows the rest, at a minute of 200 with 150 left.
	answer := func(c *quota.Check) {
		r := c.Request
		switch {
		case r.Team == "ops":
			c.Result = vocab.Result{Levels: []vocab.LevelStatus{level("", vocab.LevelTeam, "ops", vocab.Month, 300, 300, w.now.Add(time.Hour))},
				BlockedAt: &vocab.Blocked{Level: vocab.LevelTeam, ID: "ops", Window: vocab.Month}, RetryAfter: 2500 * time.Millisecond}
		case r.User == "bob":
			c.Err = fmt.Errorf("redis: %w", quota.ErrUnavailable)
		default:
			c.Result = vocab.Result{Allowed: true, Levels: []vocab.LevelStatus{level("", vocab.LevelOrg, r.Org, vocab.Minute, 200, 50, w.now.Add(time.Minute))}}
		}
	}
	type item struct {
		refused *refusal // nil: decided
		allowed bool
		retry   int64
		multi   bool
	}
	ok, denied := item{allowed: true}, item{retry: 3}
	for _, tc := range []struct {
		name   string
		caller checks.Caller
		ins    []checks.Input
		want   []item
		asked  []string // team/user/metric of each check Decide was given, in order
	}{
		{name: "every check decided", caller: acmeKey,
			ins:   []checks.Input{in("acme", "eng", "", "", -1), in("acme", "ops", "carol", "", -1), in("acme", "", "alice", "tokens", 5)},
			want:  []item{ok, denied, ok},
			asked: []string{"eng//requests", "ops/carol/requests", "eng/alice/tokens"}},
		{name: "refusals in their place, the rest decided", caller: acmeKey,
			ins: []checks.Input{in("acme", "eng", "", "", -1), checks.Input{Org: "acme", Cost: ptr(int64(-1))}, in("acme", "sales", "", "", -1),
				in("strict", "", "", "", -1), in("acme", "ops", "", "", -1), costs("acme", "eng", "", map[string]int64{"requests": 1, "tokens": 10}),
				in("acme", "ops", "zed", "", -1), in("acme", "eng", "", "gpu", 1)},
			want: []item{ok, {refused: &refusal{derrors.Invalid, "cost", ""}}, {refused: &refusal{derrors.NotFound, "", "sales"}},
				{refused: &refusal{derrors.NotFound, "", "strict"}}, denied, {allowed: true, multi: true},
				{refused: &refusal{derrors.Unprocessable, "user", "refuses unknown users"}}, {refused: &refusal{derrors.Unprocessable, "", "gpu"}}},
			asked: []string{"eng//requests", "ops//requests", "eng//requests+tokens"}},
		{name: "an engine error is its item's", caller: acmeKey,
			ins:   []checks.Input{in("acme", "eng", "bob", "", -1), in("acme", "eng", "alice", "", -1), in("acme", "eng", "bob", "", 0)},
			want:  []item{{refused: &refusal{derrors.Unavailable, "", "quota store"}}, ok, {refused: &refusal{derrors.Unavailable, "", "quota store"}}},
			asked: []string{"eng/bob/requests", "eng/alice/requests", "eng/bob/requests"}},
		{name: "every check refused: the engine not asked", caller: noScope,
			ins:  []checks.Input{in("acme", "eng", "", "", -1), in("acme", "", "", "", -1)},
			want: []item{{refused: &refusal{derrors.Forbidden, "", ""}}, {refused: &refusal{derrors.Forbidden, "", ""}}}},
		{name: "no checks", caller: acmeKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			f.decide = answer
			items, err := s.CheckBatch(context.Background(), tc.caller, tc.ins)
			if err != nil {
				t.Fatalf("CheckBatch: %v", err)
			}
			if len(items) != len(tc.want) {
				t.Fatalf("%d items, want %d", len(items), len(tc.want))
			}
			for i, want := range tc.want {
				it := items[i]
				switch {
				case want.refused != nil:
					if why := want.refused.is(it.Err); why != "" {
						t.Errorf("item %d: %v: %s", i, it.Err, why)
					}
				case it.Err != nil:
					t.Errorf("item %d: %v, want a decision", i, it.Err)
				case it.Result.Allowed != want.allowed || it.RetryAfter != want.retry || it.Multi != want.multi || !it.HasRateLimit:
					t.Errorf("item %d: allowed %v retry %d multi %v (rate limit %v), want %+v", i, it.Result.Allowed, it.RetryAfter, it.Multi, it.HasRateLimit, want)
				}
			}
			if len(tc.asked) == 0 {
				if len(f.calls) != 0 {
					t.Errorf("Decide called %d times, want never", len(f.calls))
				}
				return
			}
			if len(f.calls) != 1 {
				t.Fatalf("Decide called %d times, want once", len(f.calls))
			}
			var asked []string
			for _, c := range f.calls[0] {
				m := c.Request.Metric
				for _, x := range c.Request.More {
					m += "+" + x.Metric
				}
				asked = append(asked, c.Request.Team+"/"+c.Request.User+"/"+m)
			}
			if fmt.Sprint(asked) != fmt.Sprint(tc.asked) {
				t.Errorf("asked %v, want %v", asked, tc.asked)
			}
		})
	}
}

// TightestItem picks the item whose RateLimit a batch's answer carries: of the denied
// items the furthest retry, before any allowed one; else the least remaining, then
// the soonest reset; the first of equals; -1 when no decided item has a limit.
func TestTightestItem(t *testing.T) {
	allowed := func(rem, reset int64) checks.Item {
		return checks.Item{Decision: checks.Decision{Result: vocab.Result{Allowed: true}, HasRateLimit: true, RateLimit: checks.RateLimit{Remaining: rem, Reset: reset}}}
	}
	denied := func(reset int64) checks.Item {
		return checks.Item{Decision: checks.Decision{HasRateLimit: true, RateLimit: checks.RateLimit{Reset: reset}, RetryAfter: reset}}
	}
	failed := checks.Item{Err: derrors.New(derrors.NotFound, "team not found")}
	failedWithLimit := denied(99)
	failedWithLimit.Err = derrors.New(derrors.Unavailable, "down")
	noLimit := checks.Item{Decision: checks.Decision{Result: vocab.Result{Allowed: true}}}
	for _, tc := range []struct {
		name  string
		items []checks.Item
		want  int
	}{
		{"none", nil, -1},
		{"only errors and no limits", []checks.Item{failed, noLimit, failedWithLimit}, -1},
		{"the least remaining", []checks.Item{allowed(9, 1), allowed(3, 50), allowed(4, 2)}, 1},
		{"equal remaining: the soonest reset", []checks.Item{allowed(3, 50), allowed(3, 20), allowed(3, 30)}, 1},
		{"equals: the first", []checks.Item{noLimit, allowed(3, 20), allowed(3, 20)}, 1},
		{"a denied item before any allowed", []checks.Item{allowed(0, 1), denied(5), allowed(0, 0)}, 1},
		{"of the denied, the furthest retry", []checks.Item{denied(5), denied(30), failedWithLimit, denied(7)}, 1},
		{"equal retries: the first", []checks.Item{allowed(1, 1), denied(8), denied(8)}, 1},
		{"errors skipped", []checks.Item{failedWithLimit, failed, allowed(10, 10)}, 2},
	} {
		if got := checks.TightestItem(tc.items); got != tc.want {
			t.Errorf("%s: TightestItem = %d, want %d", tc.name, got, tc.want)
		}
	}
}
