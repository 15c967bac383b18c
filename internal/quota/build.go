package quota

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// build fills c with the EVALSHA arguments of req at now (the engine's clock,
// Redis TIME on the monotonic clock); see scripts/check.lua for ARGV. The numbers go packed
// into one argument and the bucket keys are named here: in the script, every argument
// and every number parsed or formatted costs Redis time (docs/PERFORMANCE.md).
func (e *Engine) build(c *call, req *Request, now time.Time) {
	per := e.periodAt(now, req.AnchorDay)
	k := e.orgKeys(req.Org, per)
	nowMs := now.UnixMilli()
	c.org, c.period, c.req, c.nowMs = req.Org, per, *req, nowMs
	idem := req.IdempotencyKey != ""
	nkeys := 3
	if idem {
		nkeys = 4
	}
	a := append(c.args[:0], "evalsha", checkSHA, nkeys, k.month, k.dirty, k.index)
	if idem {
		a = append(a, k.tag+"i|"+req.IdempotencyKey)
	}

	// Every window a sliding limit at any level (of any metric) limits is counted at
	// every counter; a token bucket keeps its own state (check.lua's "Token buckets").
	nm := req.metricCount()
	var mask uint8
	for m := range nm {
		_, _, ls := req.metricAt(m)
		for _, ls := range [...][]vocab.Limit{ls.Org, ls.Team, ls.User} {
			for _, l := range ls {
				if !l.Bucket() {
					mask |= windowBit(l.Window)
				}
			}
		}
	}
	nl := 1
	if req.Team != "" {
		nl++
		if req.User != "" {
			nl++
		}
	}
	force := 0.0
	if req.Mode == vocab.Shadow || req.Mode == vocab.Warn {
		force = 1
	}
	var windows [len(slidingWindows)]*bucketKeys
	var index [len(slidingWindows)]int // script window index by position in slidingWindows
	nw := 0
	for i, w := range slidingWindows {
		if mask&windowBit(w) != 0 {
			windows[nw] = k.bucket(i, w, nowMs)
			nw++
			index[i] = nw
		}
	}
	rows := 0
	cost := req.Cost // a multi-metric request's largest (check.lua's guard of MAXC)
	for m := range nm {
		_, mc, ls := req.metricAt(m)
		cost = max(cost, mc)
		rows += len(ls.Org)
		if nl > 1 {
			rows += len(ls.Team)
			if nl > 2 {
				rows += len(ls.User)
			}
		}
	}
	// Counters: nl per metric (org, team, user), metric by metric; a row's "level" is
	// its counter's index (1-based), which for one metric is the level.
	b := appendNumbers(c.nums[:0], float64(cost), force, float64(nowMs), float64(k.endMs), float64(k.expire),
		float64(nm*nl), float64(nw), float64(rows))
	for _, bk := range windows[:nw] {
		b = appendNumbers(b, float64(bk.ms), float64(nowMs-bk.n*bk.ms))
	}
	nb := 0 // token buckets: a row of one is -1 - its 1-based number
	for m := range nm {
		_, _, ls := req.metricAt(m)
		base := float64(m * nl)
		b = appendRows(b, base+1, ls.Org, &index, &nb)
		if nl > 1 {
			b = appendRows(b, base+2, ls.Team, &index, &nb)
			if nl > 2 {
				b = appendRows(b, base+3, ls.User, &index, &nb)
			}
		}
	}
	if req.Precise && nw > 0 {
		b = appendNumbers(b, PreciseSubBuckets) // check.lua's "Precise windows"
	}
	if nm > 1 {
		// check.lua's "Several metrics": each counter's cost
		for m := range nm {
			_, mc, _ := req.metricAt(m)
			for range nl {
				b = appendNumbers(b, float64(mc))
			}
		}
	}
	if nb > 0 {
		// check.lua's "Token buckets": the buckets' clock (0 Redis TIME, 1 now), then
		// each bucket row's window length (ms) and burst, in the order of its rows
		clock := 0.0
		if e.cfg.bucketsOnEngineClock {
			clock = 1
		}
		b = appendNumbers(b, clock)
		for m := range nm {
			_, _, ls := req.metricAt(m)
			b = appendBuckets(b, ls.Org)
			if nl > 1 {
				b = appendBuckets(b, ls.Team)
				if nl > 2 {
					b = appendBuckets(b, ls.User)
				}
			}
		}
	}
	c.nums = b
	// The counters' fields are written into c.names and sent as bytes: concatenated
	// strings would be two allocations a check, and the packed numbers boxed in an any
	// a third (BenchmarkServerCheck).
	if need := 3*nm + 1; cap(c.wire) < need {
		c.wire = make([]wireArg, 0, need)
	}
	wire, names := c.wire[:0], c.names[:0]
	field := func(parts ...string) any {
		from := len(names)
		for _, p := range parts {
			names = append(names, p...)
		}
		wire = append(wire, wireArg{b: names[from:len(names):len(names)]})
		return &wire[len(wire)-1]
	}
	for m := range nm {
		metric, _, _ := req.metricAt(m)
		if m == 0 {
			a = append(a, k.field(metric))
		} else {
			a = append(a, field(metric, "|o"))
		}
		if nl > 1 {
			a = append(a, field(metric, "|t|", req.Team))
			if nl > 2 {
				a = append(a, field(metric, "|u|", req.Team, "|", req.User))
			}
		}
	}
	for _, bk := range windows[:nw] {
		a = append(a, bk.cur, bk.prev)
	}
	if idem {
		a = append(a, e.ttlArg)
		for m := range nm {
			metric, _, ls := req.metricAt(m)
			prefix := ""
			if nm > 1 {
				prefix = metric + "|" // check.lua's labels of a multi-metric request
			}
			a = appendLabels(a, prefix+"o", req.Org, ls.Org)
			if nl > 1 {
				a = appendLabels(a, prefix+"t", req.Team, ls.Team)
				if nl > 2 {
					a = appendLabels(a, prefix+"u", req.User, ls.User)
				}
			}
		}
		a = append(a, fingerprint(req))
	}
	// check.lua's "Shared Redis bounds": the users' bound only for an unregistered user
	if req.Unregistered && req.User != "" {
		a = append(a, e.boundsUser)
	} else {
		a = append(a, e.bounds)
	}
	wire = append(wire, wireArg{b: b})
	c.args = append(a, &wire[len(wire)-1])
	c.wire, c.names = wire, names
}

// wireArg is an argument go-redis writes as its bytes (an encoding.BinaryMarshaler):
// a pointer to one goes into an []any without the allocation a []byte or a
// concatenated string would cost.
type wireArg struct{ b []byte }

// MarshalBinary returns the argument's bytes.
func (a *wireArg) MarshalBinary() ([]byte, error) { return a.b, nil }

// fingerprint identifies the request an idempotency key is used with: the first 16
// bytes, in hex, of SHA-256 over its org, team, user, metric and cost, then each further
// metric and its cost of a multi-metric request (ids cannot
// contain NUL, so the encoding is unambiguous). check.lua stores it with the first
// decision and refuses a repeat whose fingerprint differs, atomically, so the rule
// holds across replicas. Computed only for checks with an idempotency key.
func fingerprint(req *Request) string {
	var buf [4*129 + 20]byte // grows for a multi-metric request
	b := append(buf[:0], req.Org...)
	b = append(append(b, 0), req.Team...)
	b = append(append(b, 0), req.User...)
	b = append(append(b, 0), req.Metric...)
	b = strconv.AppendInt(append(b, 0), req.Cost, 10)
	for _, m := range req.More { // a multi-metric request: every metric and cost, in order
		if m.Derived {
			continue
		}
		b = append(append(b, 0), m.Metric...)
		b = strconv.AppendInt(append(b, 0), m.Cost, 10)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// periodAt is vocab.PeriodAt, remembering the last period of each anchor day: computing
// one is a tenth of build.
func (e *Engine) periodAt(now time.Time, anchorDay int) vocab.Period {
	if anchorDay < 1 || anchorDay > 28 {
		anchorDay = 1
	}
	slot := &e.periods[anchorDay]
	if p := slot.Load(); p != nil && !now.Before(p.Start) && now.Before(p.End) {
		return *p
	}
	p := vocab.PeriodAt(now, anchorDay)
	slot.Store(&p)
	return p
}

// appendNumbers appends vs as little-endian doubles, as check.lua unpacks its last ARGV.
func appendNumbers(b []byte, vs ...float64) []byte {
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// appendRows appends the rows of one level: its counter's index (1 org, 2 team, 3 user
// for a one-metric request; metric m's level l is m x levels + l), window index (0
// month, i the i-th sliding window, -1 concurrent, -1 - j the j-th token bucket,
// counted in nb), limit.
func appendRows(b []byte, level float64, limits []vocab.Limit, index *[len(slidingWindows)]int, nb *int) []byte {
	for _, l := range limits {
		w := 0
		if l.Window == vocab.Concurrent {
			w = -1
		} else if l.Bucket() {
			*nb++
			w = -1 - *nb
		} else {
			for i, sw := range slidingWindows {
				if sw == l.Window {
					w = index[i]
				}
			}
		}
		b = appendNumbers(b, level, float64(w), float64(l.Limit))
	}
	return b
}

// appendBuckets appends the window length (ms) and burst of each token bucket of
// limits, in their order.
func appendBuckets(b []byte, limits []vocab.Limit) []byte {
	for _, l := range limits {
		if l.Bucket() {
			b = appendNumbers(b, float64(l.Window.Duration().Milliseconds()), float64(l.Burst))
		}
	}
	return b
}

// appendLabels appends the reply labels of one level's rows, for a decision stored
// under an idempotency key: "letter|id|window|limit", a token bucket's window as
// "<seconds>:<burst>".
func appendLabels(a []any, letter, id string, limits []vocab.Limit) []any {
	for _, l := range limits {
		w := "M"
		if l.Window == vocab.Concurrent {
			w = "C"
		} else if l.Window != vocab.Month {
			w = windowSeconds(l.Window)
			if l.Bucket() {
				w += ":" + strconv.FormatInt(l.Burst, 10)
			}
		}
		a = append(a, letter+"|"+id+"|"+w+"|"+strconv.FormatInt(l.Limit, 10))
	}
	return a
}

// CheckCommand returns the EVALSHA command, arguments included, that an engine with
// the given key prefix sends for req when its clock (Redis TIME on the monotonic clock) reads
// now: for tools that measure Redis's own ceiling for the check script (loadgen
// -resp), and for simulations at chosen times, so its token buckets are decided at now
// too, not at the script's Redis TIME as an engine's are. CheckScript is the script it
// runs. It fails as New does for a bad prefix and as Check does for a bad request.
func CheckCommand(prefix string, req Request, now time.Time) ([]any, error) {
	cfg := Config{KeyPrefix: prefix, bucketsOnEngineClock: true} // a simulation's time is now
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := req.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{cfg: cfg, slotted: true} // the keys of a cluster: every one in the org's slot
	e.bounds, e.boundsUser = boundsArgs(&e.cfg)
	c := &call{}
	e.build(c, &req, now)
	for i, a := range c.args { // the tools' own values: bytes, not the call's scratch space
		if w, ok := a.(*wireArg); ok {
			c.args[i] = append([]byte(nil), w.b...)
		}
	}
	return c.args, nil
}

// CheckScript is the source of scripts/check.lua.
func CheckScript() string { return checkSrc }
