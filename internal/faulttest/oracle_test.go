package faulttest

import (
	"strings"
	"testing"
	"time"
)

// TestOracleJudges feeds the oracle histories whose verdict is known: it must find
// over-admission, lost and double-counted units, tell a Redis restart's measured loss
// and an expired lease's count apart from them, and pass an exact run.
func TestOracleJudges(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	checks := func(user string, n int, out outcome, at time.Time) []checkOp {
		var ops []checkOp
		for i := range n {
			ops = append(ops, checkOp{team: "hot", user: user, cost: 1, out: out,
				start: at.Add(time.Duration(i) * time.Millisecond), end: at.Add(time.Duration(i)*time.Millisecond + time.Millisecond)})
		}
		return ops
	}
	const user = "requests|u|hot|h0"
	limits := map[string][]limitDef{user: {{"month", 10}}}
	obs := func(counted int64) observed {
		m := map[string]int64{user: counted}
		return observed{redis: m, held: map[string]int64{}, usage: m, export: m}
	}
	for _, tc := range []struct {
		name     string
		checks   []checkOp
		faults   []injected
		leases   []leaseRecord
		replicas int
		obs      observed
		want     []string // substrings of the violations, in order; none for a pass
	}{
		{name: "exact", checks: checks("h0", 10, okay, t0), obs: obs(10)},
		{name: "unknown outcomes may count", checks: append(checks("h0", 8, okay, t0), checks("h0", 2, unknown, t0)...), obs: obs(10)},
		{name: "over-admitted and lost", checks: checks("h0", 12, okay, t0), obs: obs(10),
			want: []string{"over-admission: clients were told 12 units", "lost units: 12 admitted, 10 counted"}},
		{name: "double-counted", checks: checks("h0", 8, okay, t0), obs: obs(10),
			want: []string{"double-counted units: 10 counted in Redis, at most 8 admitted"}},
		{name: "an expired lease counted as used is the leases' over-count", checks: checks("h0", 8, okay, t0), obs: obs(10),
			leases: []leaseRecord{{id: "l_1", state: "expired", amount: 2, used: 2, fields: []string{user}, created: t0}}},
		{name: "a Redis restart's measured loss within its allowance", checks: checks("h0", 12, okay, t0), obs: obs(10),
			faults: []injected{{fault: fault{kind: restartRedis}, at: t0.Add(20 * time.Millisecond), killedAt: t0.Add(20 * time.Millisecond),
				loss: map[string]int64{user: 2}}}},
		{name: "a Redis restart that lost more than one flush interval", checks: checks("h0", 12, okay, t0), obs: obs(10),
			faults: []injected{{fault: fault{kind: restartRedis}, at: t0.Add(time.Hour), killedAt: t0.Add(time.Hour),
				loss: map[string]int64{user: 2}}},
			want: []string{"Redis restarts lost 2 units, more than the 0 admitted"}},
		{name: "an expired lease above the leases' documented bound", checks: checks("h0", 8, okay, t0), obs: obs(10),
			leases: []leaseRecord{{id: "l_1", state: "expired", amount: 2, used: 2, fields: []string{user}, created: t0}}, replicas: 1,
			want: []string{"lease l_1 settled at expiry held 2 units, above the documented bound of 0"}},
		{name: "a Redis restart before the restarted worker's first flush", checks: checks("h0", 12, okay, t0), obs: obs(10),
			faults: []injected{{fault: fault{kind: killWorker}, at: t0.Add(-time.Second)},
				{fault: fault{kind: restartRedis}, at: t0.Add(2 * time.Second), killedAt: t0.Add(2 * time.Second), loss: map[string]int64{user: 2}}}},
		{name: "the export disagrees", checks: checks("h0", 10, okay, t0),
			obs:  observed{redis: map[string]int64{user: 10}, usage: map[string]int64{user: 10}, export: map[string]int64{user: 9}},
			want: []string{"the billing export says 9 units, Redis 10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(oracleInput{hist: &history{checks: tc.checks}, faults: tc.faults, leases: tc.leases, obs: tc.obs,
				limits: limits, flushInterval: 250 * time.Millisecond, lossSlack: 250 * time.Millisecond, start: t0, replicas: tc.replicas})
			var got []string
			for _, s := range v.Violations() {
				if strings.HasPrefix(s, "user ") { // the org and team rows repeat it
					got = append(got, s)
				}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("violations:\n%s\nwant %d matching %q\n%s", strings.Join(got, "\n"), len(tc.want), tc.want, v.Report())
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to say %q", i, got[i], w)
				}
			}
		})
	}
}

// TestWorstSpans: an admission counts in a span only when its whole call is inside.
func TestWorstSpans(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	at := func(ms int) span {
		s := t0.Add(time.Duration(ms) * time.Millisecond)
		return span{s, s.Add(time.Millisecond), 1}
	}
	adm := []span{at(0), at(900), at(950), at(999), at(1000), at(1500), at(2100)}
	if clean, lossy := worstSpans(adm, time.Second, nil); clean != 5 || lossy != -1 {
		t.Errorf("worst span = %d (lossy %d), want 5 (900..1500: from 0, 999's call ends past 1000) and none", clean, lossy)
	}
	if clean, lossy := worstSpans(adm, time.Second, []time.Time{t0.Add(1200 * time.Millisecond)}); clean != 3 || lossy != 5 {
		t.Errorf("with a Redis restart at 1.2 s: clean %d lossy %d, want 3 (the span from 0) and 5", clean, lossy)
	}
}
