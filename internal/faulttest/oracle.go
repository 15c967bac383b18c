package faulttest

import (
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// limitDef is one limit of one counter.
type limitDef struct {
	window string // second, minute, month
	limit  int64
	burst  int64 // > 0: a token bucket of limit units a window holding at most burst
}

func (l limitDef) length() time.Duration {
	switch l.window {
	case "second":
		return time.Second
	case "minute":
		return time.Minute
	}
	return 0
}

// observed is what the stores said at the end, per counter field
// (<metric>|o, <metric>|t|<team>, <metric>|u|<team>|<user>).
type observed struct {
	redis  map[string]int64 // committed: the month counter less the held units
	held   map[string]int64 // still held in Redis (0 once everything settled)
	usage  map[string]int64 // the usage API's used
	export map[string]int64 // the billing export's units
}

// oracleInput is everything the oracle compares.
type oracleInput struct {
	hist          *history
	faults        []injected
	leases        []leaseRecord
	obs           observed
	limits        map[string][]limitDef // per counter field
	flushInterval time.Duration
	lossSlack     time.Duration // added to the flush interval: the flush's own run time
	start         time.Time     // of the load, for the faults' times
	replicas      int           // QUOTA_REPLICAS, for the leases' documented bound
	capacity      capacityDef   // the capacity the checks of its metric draw on; id "" for none
}

// capacityDef is an operator's capacity: limit units of metric in every sliding window.
type capacityDef struct {
	id, metric string
	window     time.Duration
	limit      int64
}

// unitsAt is units a client was told were admitted at a time, on a path.
type unitsAt struct {
	at     time.Time
	units  int64
	fields []string
}

func pathFields(metric, team, user string) []string {
	return []string{metric + "|o", metric + "|t|" + team, metric + "|u|" + team + "|" + user}
}

// tally is the oracle's account of one counter.
type tally struct {
	first, last time.Time // of the admissions that counted here
	lo, hi      int64     // what the clients' answers say was counted: certainly, at most
	unknowns    int64     // calls without a definite answer that touched it
	leaseOver   int64     // counted by leases settled at expiry (a dead replica's, or a settle that gave up)
	leaseGone   int64     // units of leases settled at expiry, counted or not
	leasesExp   int       // leases settled at expiry
	redisLoss   int64     // allowed: units admitted within one flush interval before a Redis restart
	// measured is what Redis restarts lost: the units (held ones included) Redis held
	// at its death and the ledger (with its held reservations) did not.
	measured int64
	gained   int64 // units a Redis restart gave back to Redis: settlements since the last flush undone
}

// Verdict is the oracle's result.
type Verdict struct {
	report     string
	violations []string
}

// Report is the oracle's tables: per counter, then per sliding window.
func (v Verdict) Report() string { return v.report }

// Violations are the oracle's findings, empty when the run passed.
func (v Verdict) Violations() []string { return v.violations }

// judge compares what the clients were told with the counters, the usage API and the
// export, and the admissions of every real span of each sliding window with its bound.
func judge(in oracleInput) Verdict {
	var v Verdict
	t := map[string]*tally{}
	get := func(f string) *tally {
		if t[f] == nil {
			t[f] = &tally{}
		}
		return t[f]
	}
	add := func(fields []string, lo, hi int64, unk bool) {
		for _, f := range fields {
			x := get(f)
			x.lo += lo
			x.hi += hi
			if unk {
				x.unknowns++
			}
		}
	}
	var admissions []unitsAt
	// unknowns are calls of unknown outcome: a Redis restart may have lost what they
	// counted, if they ran.
	type unknownAt struct {
		start, end time.Time
		units      int64
		fields     []string
	}
	var unknowns []unknownAt
	var redisKills []time.Time
	var lossFrom, lossTo []time.Time // per kill: usage admitted between may be lost
	for _, f := range in.faults {
		if f.kind == restartRedis {
			redisKills = append(redisKills, f.at)
			// A call Redis ran just before the kill is answered a few ms later.
			lossTo = append(lossTo, f.killedAt.Add(50*time.Millisecond))
			// One flush interval (+ the flush's own run), or back to the start of the
			// last complete flush when that is older (a loaded machine, a worker
			// just restarted).
			from := f.at.Add(-in.flushInterval - in.lossSlack)
			if !f.lastFlush.IsZero() && f.lastFlush.Before(from) {
				from = f.lastFlush
			}
			if f.lastFlush.IsZero() {
				// The worker has not completed a flush since it was last started: back
				// to the kill of the one before (+ an interval), which flushed last.
				var last time.Time
				for _, w := range in.faults {
					if w.kind == killWorker && w.at.Before(f.at) && w.at.After(last) {
						last = w.at
					}
				}
				if !last.IsZero() && last.Add(-in.flushInterval-in.lossSlack).Before(from) {
					from = last.Add(-in.flushInterval - in.lossSlack)
				}
			}
			lossFrom = append(lossFrom, from)
		}
	}

	counts := map[string]int{}
	var leased int
	for _, c := range in.hist.checks {
		fields := c.fields()
		counts["check "+c.out.String()]++
		switch c.out {
		case okay:
			add(fields, c.cost, c.cost, false)
			seen(get(fields[2]), c.end)
			if c.leased {
				leased++ // its units were taken from Redis when its lease was (below)
			} else {
				admissions = append(admissions, unitsAt{c.end, c.cost, fields})
			}
		case unknown:
			add(fields, 0, c.cost, true)
			unknowns = append(unknowns, unknownAt{c.start, c.end, c.cost, fields})
		}
	}
	for _, r := range in.hist.resvs {
		fields := pathFields("tokens", r.team, r.user)
		counts["reserve "+r.out.String()]++
		e := r.expiryUnits()
		switch r.out {
		case okay:
		case unknown:
			add(fields, 0, e, true)
			unknowns = append(unknowns, unknownAt{r.start, r.end, r.amount, fields})
			continue
		default:
			continue
		}
		admissions = append(admissions, unitsAt{r.end, r.amount, fields})
		seen(get(fields[2]), r.end)
		if r.action == "" {
			counts["left to expire"]++
			add(fields, e, e, false)
			continue
		}
		counts[r.action+" "+r.settleOut.String()]++
		switch {
		case r.settleOut == okay && r.action == "commit":
			add(fields, r.used, r.used, false)
			// A commit is usage too: a Redis restart before the next flush undoes it.
			admissions = append(admissions, unitsAt{r.settleEnd, r.used, fields})
		case r.settleOut == okay: // released
		case r.settleOut == notSent || r.settleOut == settled: // it expired
			add(fields, e, e, false)
		case r.action == "commit" && r.settleOut == notFound: // only a Redis restart forgets one
			add(fields, min(r.used, e), max(r.used, e), false)
		case r.action == "commit" && r.settleOut == unknown:
			add(fields, min(r.used, e), max(r.used, e), true)
		default: // a release of unknown fate: released, or expired
			add(fields, 0, e, true)
		}
	}
	for _, l := range in.leases {
		admissions = append(admissions, unitsAt{l.created, l.amount, l.fields})
		if l.state == "committed" {
			admissions = append(admissions, unitsAt{l.settled, l.used, l.fields})
		}
		if l.state == "expired" {
			// docs/ARCHITECTURE.md "Leases": a lease is at most the least headroom of
			// its path's limits / (16 x QUOTA_REPLICAS), so what a dead replica's lease
			// over-counts is at most its path's month limit / (16 x replicas).
			for _, f := range l.fields {
				for _, lim := range in.limits[f] {
					if bound := lim.limit / int64(16*max(1, in.replicas)); in.replicas > 0 && lim.window == "month" && l.amount > bound {
						v.violations = append(v.violations, fmt.Sprintf("%s: lease %s settled at expiry held %d units, above the documented bound of %d (the month limit %d / (16 x %d replicas))",
							fieldName(f), l.id, l.amount, bound, lim.limit, in.replicas))
					}
				}
			}
			for _, f := range l.fields {
				x := get(f)
				x.leaseOver += l.used
				x.leaseGone += l.amount
				x.leasesExp++
			}
		}
	}
	for _, f := range in.faults {
		for k, n := range f.loss {
			get(k).measured += n
		}
		for k, n := range f.gain {
			get(k).gained += n
		}
	}
	for i := range redisKills {
		for _, a := range admissions {
			if a.at.After(lossFrom[i]) && !a.at.After(lossTo[i]) {
				for _, f := range a.fields {
					get(f).redisLoss += a.units
				}
			}
		}
		for _, u := range unknowns {
			if u.end.After(lossFrom[i]) && !u.start.After(lossTo[i]) {
				for _, f := range u.fields {
					get(f).redisLoss += u.units
				}
			}
		}
	}
	for f := range in.obs.redis {
		get(f)
	}

	var b strings.Builder
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(&b, "calls:")
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, counts[k])
	}
	var expired, expiredUnits int64
	for _, l := range in.leases {
		if l.state == "expired" {
			expired++
			expiredUnits += l.amount
		}
	}
	states := map[string]int{}
	for _, l := range in.leases {
		states[l.state]++
	}
	fmt.Fprintf(&b, "\nleases: %d leased 200s; %d lease records seen: %d committed, %d settled by expiry (%d units, counted %s), %d lost with Redis, %d held\n",
		leased, len(in.leases), states["committed"], expired, expiredUnits, countedAs(in.leases), states["lost"], states["held"])
	for _, s := range in.hist.rejected {
		v.violations = append(v.violations, "unexpected answer: "+s)
	}

	fields := make([]string, 0, len(t))
	for f := range t {
		fields = append(fields, f)
	}
	slices.SortFunc(fields, func(a, b string) int { return strings.Compare(fieldOrder(a), fieldOrder(b)) })
	tw := tabwriter.NewWriter(&b, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "counter\twindow\tlimit\tadmitted\tunknown\tcounted\tusage API\texport\tover\tlost\textra\tRedis restarts: lost/gained (allowed)\tlease over-count\t")
	type cleanRow struct {
		win, lim                                 string
		n                                        int
		lo, unk, counted, usage, export, allowed int64
	}
	clean := map[string]*cleanRow{}
	var cleanKeys []string
	for _, f := range fields {
		x := t[f]
		counted, usage, export := in.obs.redis[f], in.obs.usage[f], in.obs.export[f]
		lim := int64(-1)
		for _, l := range in.limits[f] {
			if l.window == "month" {
				lim = l.limit
			}
		}
		loss := max(0, x.lo-counted)
		explained := min(loss, x.measured)
		lost := loss - explained
		extra := max(0, counted-x.hi-x.leaseOver-x.gained)
		over := int64(0)
		limStr, win := "-", "-"
		if lim >= 0 {
			over = max(0, x.lo-lim)
			limStr, win = fmt.Sprint(lim), "month"
		}
		// A restart that lost X units of a counter lets up to X more be admitted, even
		// where a forced check counts them again later (a lease Redis forgot).
		overBeyond := max(0, over-min(over, x.measured))
		p := strings.Split(f, "|")
		if len(p) == 4 && overBeyond == 0 && lost == 0 && extra == 0 && x.measured == 0 && x.gained == 0 &&
			x.leasesExp == 0 && usage == counted && export == counted && in.obs.held[f] == 0 {
			// A user with nothing to report is summed into its team's "clean" row.
			k := p[0] + "|" + p[2]
			if clean[k] == nil {
				clean[k] = &cleanRow{win: win, lim: limStr}
				cleanKeys = append(cleanKeys, k)
			}
			r := clean[k]
			r.n++
			r.lo, r.unk, r.counted, r.usage, r.export = r.lo+x.lo, r.unk+x.unknowns, r.counted+counted, r.usage+usage, r.export+export
			r.allowed += x.redisLoss
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d/%d (%d)\t%d\t\n",
			fieldName(f), win, limStr, x.lo, x.unknowns, counted, usage, export, overBeyond, lost, extra, x.measured, x.gained, x.redisLoss, x.leaseOver)
		name := fieldName(f)
		if overBeyond > 0 || lost > 0 || extra > 0 || x.measured > x.redisLoss {
			name += " (" + in.during(x) + ")"
		}
		if overBeyond > 0 {
			v.violations = append(v.violations, fmt.Sprintf("%s: over-admission: clients were told %d units were theirs against a month limit of %d (%d over, %d of it explained by a Redis restart)",
				name, x.lo, lim, over, min(over, x.measured)))
		}
		if lost > 0 {
			v.violations = append(v.violations, fmt.Sprintf("%s: lost units: %d admitted, %d counted in Redis: %d lost beyond the %d lost with a Redis restart",
				name, x.lo, counted, lost, x.measured))
		}
		if x.measured > x.redisLoss {
			v.violations = append(v.violations, fmt.Sprintf("%s: Redis restarts lost %d units, more than the %d admitted within one flush interval (+%v), or since the last complete flush, before them",
				name, x.measured, x.redisLoss, in.lossSlack))
		}
		if extra > 0 {
			v.violations = append(v.violations, fmt.Sprintf("%s: double-counted units: %d counted in Redis, at most %d admitted (%d calls of unknown outcome), %d counted by expired leases and %d given back to Redis by a restart: %d extra",
				name, counted, x.hi, x.unknowns, x.leaseOver, x.gained, extra))
		}
		if usage != counted {
			v.violations = append(v.violations, fmt.Sprintf("%s: the usage API says %d used, Redis %d", name, usage, counted))
		}
		if export != counted {
			v.violations = append(v.violations, fmt.Sprintf("%s: the billing export says %d units, Redis %d", name, export, counted))
		}
		if h := in.obs.held[f]; h != 0 {
			v.violations = append(v.violations, fmt.Sprintf("%s: %d units still held in Redis after every reservation expired", name, h))
		}
	}
	for _, k := range cleanKeys {
		r := clean[k]
		metric, team, _ := strings.Cut(k, "|")
		fmt.Fprintf(tw, "user %s/* %s: %d more, summed\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t0\t0\t0\t0/0 (%d)\t0\t\n",
			team, metric, r.n, r.win, r.lim, r.lo, r.unk, r.counted, r.usage, r.export, r.allowed)
	}
	_ = tw.Flush()

	// Sliding windows: the admissions in every real span of the window's length.
	tw = tabwriter.NewWriter(&b, 0, 0, 1, ' ', tabwriter.AlignRight)
	header := false
	for _, f := range fields {
		for _, l := range in.limits[f] {
			w := l.length()
			if w == 0 || l.burst > 0 {
				continue
			}
			if !header {
				fmt.Fprintln(&b)
				fmt.Fprintln(tw, "counter\twindow\tlimit\tbound\tworst real span\tover\tworst span with a Redis restart\t")
				header = true
			}
			var spans []span
			for _, c := range in.hist.checks {
				if c.out == okay && slices.Contains(c.fields(), f) {
					spans = append(spans, span{c.start, c.end, c.cost})
				}
			}
			clean, lossy := worstSpans(spans, w, redisKills)
			bound := 2 * l.limit
			over := max(0, clean-bound)
			cleanStr, lossyStr := fmt.Sprint(clean), fmt.Sprint(lossy)
			if clean < 0 {
				cleanStr = "- (every span near a restart)"
			}
			if lossy < 0 {
				lossyStr = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%d\t%s\t\n", fieldName(f), l.window, l.limit, bound, cleanStr, over, lossyStr)
			if over > 0 {
				v.violations = append(v.violations, fmt.Sprintf("%s: %d admitted in a real %s span, above the two-bucket bound of %d (2 x %d)",
					fieldName(f), clean, l.window, bound, l.limit))
			}
		}
	}
	_ = tw.Flush()
	v.violations = append(v.violations, judgeBuckets(&b, in, fields)...)
	v.violations = append(v.violations, judgeCapacity(&b, in, redisKills)...)
	v.report = b.String()
	return v
}

// judgeBuckets writes a table row per token bucket counter and returns its findings:
// over every real span [start_i, end_j] of two certainly admitted checks, the units of
// the checks whose whole send-to-answer interval lies in it must not exceed
// burst + limit x (end_j - start_i) / window (quota's doc.go "Token buckets"), plus one
// burst per Redis restart the span holds (the bucket came back full). The true
// admission times lie inside the calls, so the figure never overstates. No allowance
// for the replicas' clocks, however far apart (clockSpread measures it, for the
// report): a bucket is decided on its Redis's TIME, one clock whichever replica asks.
// Nor for clock steps: they move no Redis clock and no engine's decisions.
func judgeBuckets(b *strings.Builder, in oracleInput, fields []string) []string {
	var restarts []window
	for _, f := range in.faults {
		if f.kind != restartRedis {
			continue
		}
		to := f.healed
		if to.IsZero() {
			to = f.killedAt
		}
		if to.Before(f.at) {
			to = f.at
		}
		restarts = append(restarts, window{f.at, to})
	}
	skew, samples := clockSpread(in.hist.resvs)
	skew = skew.Round(10 * time.Microsecond)
	var violations []string
	tw := tabwriter.NewWriter(b, 0, 0, 1, ' ', tabwriter.AlignRight)
	header := false
	for _, f := range fields {
		for _, l := range in.limits[f] {
			if l.burst <= 0 || l.length() == 0 {
				continue
			}
			if !header {
				fmt.Fprintf(b, "\ntoken buckets (decided on Redis TIME; the replicas' engine clocks were at least %v apart, from %d reservations' expires_at)\n",
					skew, samples)
				fmt.Fprintln(tw, "token bucket\trate\tburst\tadmitted\tworst real span\texcess\tneeds\tworst span with a Redis restart (+1 burst each)\texcess\tneeds\t")
				header = true
			}
			var spans []span
			var admitted int64
			leased := 0
			for _, c := range in.hist.checks {
				if c.out == okay && slices.Contains(c.fields(), f) {
					spans = append(spans, span{c.start, c.end, c.cost})
					admitted += c.cost
					if c.leased {
						leased++
					}
				}
			}
			clean, lossy := worstBucketSpans(spans, l, restarts)
			fmt.Fprintf(tw, "%s\t%d/%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", fieldName(f), l.limit, l.window, l.burst, admitted,
				clean.String(in.start), clean.excessString(), clean.needsString(), lossy.String(in.start), lossy.excessString(), lossy.needsString())
			if clean.over(0) {
				violations = append(violations, fmt.Sprintf("%s: token bucket passed: %d units admitted in the real span %s, above burst + rate x span = %d + %d x %.3fs / 1 %s = %.2f by %.2f (%v at the rate)",
					fieldName(f), clean.units, clean.spanString(in.start), l.burst, l.limit, clean.length().Seconds(), l.window, clean.bound, clean.excess(), clean.needs()))
			}
			if lossy.over(0) {
				violations = append(violations, fmt.Sprintf("%s: token bucket passed across Redis restarts: %d units admitted in the real span %s, which holds %s, above %d bursts + rate x span = %d x %d + %d x %.3fs / 1 %s = %.2f by %.2f (%v at the rate)",
					fieldName(f), lossy.units, lossy.spanString(in.start), plural(lossy.restarts, "restart"), 1+lossy.restarts, 1+lossy.restarts, l.burst, l.limit, lossy.length().Seconds(), l.window, lossy.bound, lossy.excess(), lossy.needs()))
			}
			if leased > 0 {
				violations = append(violations, fmt.Sprintf("%s: %d of its 200s were leased: a path with a token bucket is never leased", fieldName(f), leased))
			}
		}
	}
	_ = tw.Flush()
	return violations
}

// clockSpread is how far apart the replicas' engine clocks (less the real one) were at
// least, over the run, and from how many samples: each reservation's expires_at less
// its ttl is its replica's engine clock in ms (truncated, as a check's script gets it),
// read between the call's send and answer, so the engine was ahead of the real clock
// by at least engine - end and at most engine - start. The largest lower bound less
// the smallest upper bound is a spread that certainly occurred (0 without samples).
func clockSpread(resvs []resvOp) (time.Duration, int) {
	var lo, hi time.Duration
	n := 0
	for _, r := range resvs {
		if r.out != okay || r.engineAt.IsZero() {
			continue
		}
		l, h := r.engineAt.Sub(r.end), r.engineAt.Sub(r.start)
		if n == 0 || l > lo {
			lo = l
		}
		if n == 0 || h < hi {
			hi = h
		}
		n++
	}
	return max(0, lo-hi), n
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// window is a real time interval [from, to].
type window struct{ from, to time.Time }

// bucketSpan is a real span of a token bucket's admissions and its bound.
type bucketSpan struct {
	from, to time.Time // zero: no span of the kind
	units    int64     // admitted by calls wholly inside
	restarts int       // Redis restarts the span holds
	bursts   int64     // (1 + restarts) x burst
	limit    int64
	window   time.Duration
	bound    float64 // bursts + limit x (to - from) / window
}

func (s bucketSpan) length() time.Duration { return s.to.Sub(s.from) }
func (s bucketSpan) excess() float64       { return float64(s.units) - s.bound }

// needs is the time at the bucket's rate that the excess is worth (0 within the bound).
func (s bucketSpan) needs() time.Duration {
	if s.from.IsZero() || s.limit <= 0 || s.excess() <= 0 {
		return 0
	}
	return time.Duration(s.excess() * float64(s.window) / float64(s.limit)).Round(10 * time.Microsecond)
}

// over reports whether the span passed its bound with skew more time (the oracle gives
// none: one clock decides), compared exactly:
// (units - bursts) x window against limit x (length + skew), in ns, as 128-bit products.
func (s bucketSpan) over(skew time.Duration) bool {
	if s.from.IsZero() || s.units <= s.bursts {
		return false
	}
	hi1, lo1 := bits.Mul64(uint64(s.units-s.bursts), uint64(s.window))
	hi2, lo2 := bits.Mul64(uint64(s.limit), uint64(s.length()+skew))
	return hi1 > hi2 || (hi1 == hi2 && lo1 > lo2)
}

func (s bucketSpan) spanString(start time.Time) string {
	return fmt.Sprintf("%.3fs-%.3fs", s.from.Sub(start).Seconds(), s.to.Sub(start).Seconds())
}

// String is "34 in 0.412s (bound 34.12) at 3.100s-3.512s", or "-".
func (s bucketSpan) String(start time.Time) string {
	if s.from.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%d in %.3fs (bound %.2f) at %s", s.units, s.length().Seconds(), s.bound, s.spanString(start))
}

func (s bucketSpan) excessString() string {
	if s.from.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%+.3f", s.excess())
}

func (s bucketSpan) needsString() string {
	if d := s.needs(); d > 0 {
		return d.String()
	}
	return "-"
}

// worstBucketSpans returns, over the real spans [start_i, end_j] of pairs of
// admissions, the span whose units (of admissions whose whole call lies in it) most
// exceed (or least fall short of) the bucket's bound: clean among the spans that hold
// no Redis restart, lossy among those that hold one or more (one burst more allowed
// each). A span holds a restart when it meets the restart's interval (writes paused
// to Redis ready again): a span that does not was decided on one Redis.
func worstBucketSpans(adm []span, l limitDef, restarts []window) (clean, lossy bucketSpan) {
	w := l.length()
	byStart := slices.Clone(adm)
	slices.SortFunc(byStart, func(a, b span) int { return a.start.Compare(b.start) })
	byEnd := slices.Clone(adm)
	slices.SortFunc(byEnd, func(a, b span) int { return a.end.Compare(b.end) })
	rs := slices.Clone(restarts)
	slices.SortFunc(rs, func(a, b window) int { return a.from.Compare(b.from) })
	for i, a := range byStart {
		if i > 0 && a.start.Equal(byStart[i-1].start) {
			continue // the first of equal starts counts them all
		}
		// Restarts over before the span starts; those begun by its end are counted
		// as the end moves on.
		before := 0
		for _, r := range rs {
			if r.to.Before(a.start) {
				before++
			}
		}
		begun := 0
		var units int64
		for _, c := range byEnd {
			if c.start.Before(a.start) {
				continue
			}
			units += c.units
			for begun < len(rs) && !rs[begun].from.After(c.end) {
				begun++
			}
			held := max(0, begun-before)
			length := c.end.Sub(a.start)
			bursts := int64(1+held) * l.burst
			s := bucketSpan{from: a.start, to: c.end, units: units, restarts: held, bursts: bursts, limit: l.limit, window: w,
				bound: float64(bursts) + float64(l.limit)*float64(length)/float64(w)}
			worst := &clean
			if held > 0 {
				worst = &lossy
			}
			if worst.from.IsZero() || s.excess() > worst.excess() ||
				(s.excess() == worst.excess() && s.units > worst.units) {
				*worst = s
			}
		}
	}
	return clean, lossy
}

// seen widens the span of a counter's admissions.
func seen(x *tally, at time.Time) {
	if x.first.IsZero() || at.Before(x.first) {
		x.first = at
	}
	if at.After(x.last) {
		x.last = at
	}
}

// during names the faults injected while the counter was admitting, and its expired
// leases.
func (in oracleInput) during(x *tally) string {
	if x.first.IsZero() { // an org's or a team's: the sum of its users'
		return "the sum of its users'"
	}
	var fs []string
	for _, f := range in.faults {
		if !f.at.Before(x.first.Add(-time.Second)) && !f.at.After(x.last) {
			fs = append(fs, fmt.Sprintf("%s at %.2fs", f.fault, f.at.Sub(in.start).Seconds()))
		}
	}
	s := fmt.Sprintf("admitting from %.2fs to %.2fs", x.first.Sub(in.start).Seconds(), x.last.Sub(in.start).Seconds())
	if len(fs) > 0 {
		s += "; faults meanwhile: " + strings.Join(fs, ", ")
	}
	if x.leasesExp > 0 {
		s += fmt.Sprintf("; %d of its leases settled at expiry, %d units, %d counted", x.leasesExp, x.leaseGone, x.leaseOver)
	}
	return s
}

func countedAs(leases []leaseRecord) string {
	var used, amount int64
	for _, l := range leases {
		if l.state == "expired" {
			used += l.used
			amount += l.amount
		}
	}
	switch {
	case amount == 0:
		return "-"
	case used == amount:
		return "as used (on_expiry commit)"
	case used == 0:
		return "as nothing: given back (on_expiry release)"
	}
	return fmt.Sprintf("%d of %d", used, amount)
}

type span struct {
	start, end time.Time
	units      int64
}

// worstSpans returns the most units admitted within one real span [t, t+w) of the
// window's length, counting an admission only when its whole call (send to answer)
// lies in the span, so the figure never overstates; clean over the spans with no Redis
// restart within a window's length of them (the buckets are not durable), lossy over
// the others; -1 when there is no span of the kind.
func worstSpans(adm []span, w time.Duration, kills []time.Time) (clean, lossy int64) {
	clean, lossy = -1, -1 // no span of the kind
	sort.Slice(adm, func(i, j int) bool { return adm[i].start.Before(adm[j].start) })
	for i := range adm {
		from := adm[i].start
		to := from.Add(w)
		var n int64
		for j := i; j < len(adm) && adm[j].start.Before(to); j++ {
			if adm[j].end.Before(to) {
				n += adm[j].units
			}
		}
		hit := false
		for _, k := range kills {
			if k.After(from.Add(-w)) && k.Before(to) {
				hit = true
			}
		}
		if hit {
			lossy = max(lossy, n)
		} else {
			clean = max(clean, n)
		}
	}
	return clean, lossy
}

// fieldName is a counter field in words: "org requests", "team hot requests",
// "user hot/h3 requests".
func fieldName(f string) string {
	p := strings.Split(f, "|")
	switch {
	case len(p) == 2:
		return "org " + p[0]
	case len(p) == 3:
		return "team " + p[2] + " " + p[0]
	case len(p) == 4:
		return "user " + p[2] + "/" + p[3] + " " + p[0]
	}
	return f
}

// fieldOrder sorts org, then teams, then users, naturally by number.
func fieldOrder(f string) string {
	p := strings.Split(f, "|")
	key := fmt.Sprintf("%d|%s", len(p), p[0])
	for _, s := range p[2:] {
		// Pad a trailing number so h10 sorts after h9.
		i := len(s)
		for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
			i--
		}
		key += "|" + s[:i] + fmt.Sprintf("%08s", s[i:])
	}
	return key
}

// judgeCapacity writes the capacity's row and returns its findings: the units of its
// metric certainly admitted within any real span of its window's length, counting a
// check only when its whole call lies in the span, must not exceed its limit (grants
// included: a replica's grant is counted in the window when taken, and it is spent
// only within the sub-bucket it was counted in, internal/quota/capacity.go). A span
// within a window of a Redis restart may hold one more limit per restart (the window
// is not durable: a Redis that comes back empty has forgotten it).
func judgeCapacity(b *strings.Builder, in oracleInput, kills []time.Time) []string {
	cp := in.capacity
	if cp.id == "" {
		return nil
	}
	var spans []span
	var admitted, refused int64
	for _, c := range in.hist.checks {
		if c.metric != cp.metric {
			continue
		}
		switch c.out {
		case okay:
			spans = append(spans, span{c.start, c.end, c.cost})
			admitted += c.cost
		case denied:
			refused++
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].start.Before(spans[j].start) })
	var clean, lossy int64 = -1, -1
	var lossyKills int
	for i := range spans {
		from := spans[i].start
		to := from.Add(cp.window)
		var n int64
		for j := i; j < len(spans) && spans[j].start.Before(to); j++ {
			if spans[j].end.Before(to) {
				n += spans[j].units
			}
		}
		hits := 0
		for _, k := range kills {
			if k.After(from.Add(-cp.window)) && k.Before(to) {
				hits++
			}
		}
		switch {
		case hits == 0:
			clean = max(clean, n)
		case n-int64(hits)*cp.limit > lossy-int64(lossyKills)*cp.limit:
			lossy, lossyKills = n, hits
		}
	}
	spanStr := func(n int64) string {
		if n < 0 {
			return "- (none)"
		}
		return fmt.Sprint(n)
	}
	fmt.Fprintf(b, "\ncapacity %s: %d %s a %v; %d units admitted, %d checks refused; worst real span %s (bound %d), worst span with a Redis restart %s (%d restarts, bound %d)\n",
		cp.id, cp.limit, cp.metric, cp.window, admitted, refused, spanStr(clean), cp.limit, spanStr(lossy), lossyKills, int64(1+lossyKills)*cp.limit)
	var out []string
	if clean > cp.limit {
		out = append(out, fmt.Sprintf("capacity %s: %d units admitted in a real span of %v, above its limit %d", cp.id, clean, cp.window, cp.limit))
	}
	if lossy > int64(1+lossyKills)*cp.limit {
		out = append(out, fmt.Sprintf("capacity %s: %d units admitted in a real span of %v beside %d Redis restarts, above %d", cp.id, lossy, cp.window, lossyKills, int64(1+lossyKills)*cp.limit))
	}
	if admitted == 0 {
		out = append(out, fmt.Sprintf("capacity %s: nothing admitted: the load did not reach it", cp.id))
	}
	if refused == 0 {
		out = append(out, fmt.Sprintf("capacity %s: no check refused: the load never saturated it", cp.id))
	}
	return out
}
