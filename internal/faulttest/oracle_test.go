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
	limits := map[string][]limitDef{user: {{window: "month", limit: 10}}}
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

// TestOracleJudgesBuckets feeds the oracle token bucket histories (10 a second, burst
// 30) whose verdict is known: within burst + rate x span it passes; past it, it names
// the counter and the span; past it only across a Redis restart, within one more burst,
// it passes, and beyond that it fails.
func TestOracleJudgesBuckets(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	// checks admits n checks of cost 1 from at, one every gap ms, each call 1 ms long.
	checks := func(n, at, gap int) []checkOp {
		var ops []checkOp
		for i := range n {
			s := ms(at + i*gap)
			ops = append(ops, checkOp{team: "burst", user: "b0", cost: 1, out: okay, start: s, end: s.Add(time.Millisecond)})
		}
		return ops
	}
	// slow admits n checks of cost 1, each a call from from to to ms.
	slow := func(n, from, to int) []checkOp {
		ops := checks(n, from, 0)
		for i := range ops {
			ops[i].end = ms(to)
		}
		return ops
	}
	const user = "requests|u|burst|b0"
	limits := map[string][]limitDef{user: {{window: "second", limit: 10, burst: 30}}}
	restart := func(at, healed int) injected {
		return injected{fault: fault{kind: restartRedis}, at: ms(at), killedAt: ms(at + 10), healed: ms(healed)}
	}
	// Two reservations, through replicas whose engine clocks were at least 5 ms apart
	// (one 3-4 ms ahead of the real clock, one 2-3 ms behind), given back: they count
	// nothing.
	resv := func(at, ahead int) resvOp {
		return resvOp{team: "resv", user: "v0", amount: 1, out: okay, action: "release", settleOut: okay,
			start: ms(at), end: ms(at + 1), engineAt: ms(at + ahead)}
	}
	apart := []resvOp{resv(0, 4), resv(50, -2)}
	for _, tc := range []struct {
		name   string
		checks []checkOp
		resvs  []resvOp
		faults []injected
		want   []string // substrings of the violations, in order; none for a pass
	}{
		// 30 in 30 ms, then one every 100 ms: the bucket's own pace, tight to 0.31 units.
		{name: "a burst, then the rate", checks: append(checks(30, 0, 1), checks(20, 130, 100)...)},
		{name: "one more than the burst at once", checks: checks(31, 0, 1),
			want: []string{"user burst/b0 requests: token bucket passed: 31 units admitted in the real span 0.000s-0.031s, above burst + rate x span = 30 + 10 x 0.031s / 1 second = 30.31 by 0.69 (69ms at the rate)"}},
		{name: "refilled faster than the rate", checks: append(checks(30, 0, 1), checks(10, 500, 1)...),
			want: []string{"token bucket passed: 40 units admitted in the real span 0.000s-0.510s, above burst + rate x span = 30 + 10 x 0.510s / 1 second = 35.10 by 4.90"}},
		{name: "a second burst across a Redis restart", checks: append(checks(30, 0, 1), checks(30, 500, 1)...),
			faults: []injected{restart(200, 400)}},
		{name: "the burst after a restart is clean", checks: append(checks(30, 0, 1), checks(31, 500, 1)...),
			faults: []injected{restart(200, 400)},
			want:   []string{"token bucket passed: 31 units admitted in the real span 0.500s-0.531s"}},
		// 31 units by 96 ms: 0.04 over the bound. Replicas whose engine clocks were 5 ms
		// apart excuse nothing: a bucket is decided on one clock, its Redis's TIME.
		{name: "over by less than the replicas' clocks were apart", checks: append(checks(30, 0, 1), checks(1, 95, 1)...), resvs: apart,
			want: []string{"31 units admitted in the real span 0.000s-0.096s, above burst + rate x span = 30 + 10 x 0.096s / 1 second = 30.96 by 0.04 (4ms at the rate)"}},
		{name: "over with the replicas' clocks not apart", checks: append(checks(30, 0, 1), checks(1, 95, 1)...),
			want: []string{"31 units admitted in the real span 0.000s-0.096s, above burst + rate x span = 30 + 10 x 0.096s / 1 second = 30.96 by 0.04 (4ms at the rate)"}},
		// Ten calls that began before the restart and were answered after it fit in no
		// clean span: only the span holding the restart has them, 10 above its allowance.
		{name: "more than a burst more across a Redis restart", checks: append(append(checks(30, 0, 1), slow(10, 50, 250)...), checks(30, 300, 1)...),
			faults: []injected{restart(100, 200)},
			want:   []string{"token bucket passed across Redis restarts: 70 units admitted in the real span 0.000s-0.330s, which holds 1 restart, above 2 bursts + rate x span = 2 x 30 + 10 x 0.330s / 1 second = 63.30 by 6.70"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n int64
			for _, c := range tc.checks {
				n += c.cost
			}
			m := map[string]int64{"requests|o": n, "requests|t|burst": n, user: n}
			v := judge(oracleInput{hist: &history{checks: tc.checks, resvs: tc.resvs}, faults: tc.faults, limits: limits,
				obs:           observed{redis: m, held: map[string]int64{}, usage: m, export: m},
				flushInterval: 250 * time.Millisecond, lossSlack: 250 * time.Millisecond, start: t0, replicas: 3})
			got := v.Violations()
			if len(got) != len(tc.want) {
				t.Fatalf("violations:\n%s\nwant %d matching %q\n%s", strings.Join(got, "\n"), len(tc.want), tc.want, v.Report())
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to say %q", i, got[i], w)
				}
			}
			if !strings.Contains(v.Report(), "user burst/b0 requests 10/second") {
				t.Errorf("the report has no row for the bucket:\n%s", v.Report())
			}
		})
	}
}

// TestWorstBucketSpans: a span's units are those of the calls wholly inside it, and a
// span exactly at its bound has not passed it.
func TestWorstBucketSpans(t *testing.T) {
	t0 := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	call := func(from, to int, units int64) span {
		return span{t0.Add(time.Duration(from) * time.Millisecond), t0.Add(time.Duration(to) * time.Millisecond), units}
	}
	l := limitDef{window: "second", limit: 10, burst: 30}
	// 30 units, then 1 more 100 ms later: 31 in 0.1 s, the bound exactly.
	clean, lossy := worstBucketSpans([]span{call(0, 50, 30), call(90, 100, 1)}, l, nil)
	if clean.units != 31 || clean.over(0) || clean.excess() != 0 || !lossy.from.IsZero() {
		t.Errorf("at the bound: worst %+v (over %v), lossy %+v; want 31 units, excess 0, not over, no lossy span", clean, clean.over(0), lossy)
	}
	// A call from 0 to 500 ms counts in no span that starts later: not in 400-403 ms,
	// where it would put 34 units against a bound of 30.03.
	clean, _ = worstBucketSpans([]span{call(0, 500, 28), call(400, 401, 3), call(402, 403, 3)}, l, nil)
	if clean.units != 34 || clean.length() != 500*time.Millisecond || clean.over(0) {
		t.Errorf("worst %+v, want 34 units in 0.5 s (bound 35), not over", clean)
	}
}

// TestOracleJudgesCapacity feeds judgeCapacity histories of a capacity of 10 gpu units
// a second whose verdict is known: within the limit in every real second it passes;
// 11 in a second fails; 18 in a second beside a Redis restart passes (one more limit
// per restart) and 21 fails; a history with no refusal says the load never saturated it.
func TestOracleJudgesCapacity(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	capOf := capacityDef{id: "gpus", metric: "gpu", window: time.Second, limit: 10}
	// run admits n checks of cost 1 from at, one every gap ms, then one refusal.
	run := func(n, at, gap int) []checkOp {
		var ops []checkOp
		for i := range n {
			s := ms(at + i*gap)
			ops = append(ops, checkOp{team: "cap", user: "c0", metric: "gpu", cost: 1, out: okay, start: s, end: s.Add(time.Millisecond)})
		}
		return append(ops, checkOp{team: "cap", user: "c0", metric: "gpu", cost: 1, out: denied, start: ms(at), end: ms(at + 1)})
	}
	restart := injected{fault: fault{kind: restartRedis}, at: ms(5000)}
	for _, tc := range []struct {
		name   string
		checks []checkOp
		kills  []time.Time
		want   string // a substring of the one finding; "" for none
	}{
		{"10 a second for 3 s", append(append(run(10, 0, 90), run(10, 1000, 90)...), run(10, 2000, 90)...), nil, ""},
		{"11 in one second", run(11, 0, 90), nil, "11 units admitted in a real span of 1s, above its limit 10"},
		{"18 beside a restart", run(18, 4600, 40), []time.Time{restart.at}, ""},
		{"21 beside a restart", run(21, 4600, 40), []time.Time{restart.at}, "21 units admitted in a real span of 1s beside 1 Redis restarts, above 20"},
		{"never refused", run(5, 0, 90)[:5], nil, "never saturated it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			got := judgeCapacity(&b, oracleInput{hist: &history{checks: tc.checks}, capacity: capOf}, tc.kills)
			t.Logf("%s", strings.TrimSpace(b.String()))
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("findings %q, want none", got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
				t.Errorf("findings %q, want one saying %q", got, tc.want)
			}
		})
	}
}
