package quota

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Script reply statuses (see scripts/check.lua).
const (
	statusAllowed  = 'A'
	statusDenied   = 'D'
	statusOver     = 'W'
	statusHydrate  = 'H'
	statusReplay   = 'R'
	statusConflict = 'C'
	statusBound    = 'Q' // past one of the org's bounds (bounds.go): nothing counted
	// statusSaturated comes before a decision whose check saturated a counter no limit
	// bounds: it stopped at MaxCounter, the units past it not counted there
	// (docs/ARCHITECTURE.md, "Bounded numbers").
	statusSaturated = 'B'
)

// decode reads a decision of check.lua (or the decision in reserve.lua's reply) into
// a Result, and returns its status byte so the caller can tell a request for
// hydration ("H") apart. A decision comes in one of two forms:
//
//   - packed (a check without an idempotency key; every reservation): numbers only,
//     every row's labels known here from req, per and nowMs (decodePacked);
//   - text (a check with an idempotency key: the decision stored for its replays, and
//     a replay, 'R' first): "status;now;retry;blocked" then a row per limit,
//     "[metric|]level|id|window|limit|used|reset", the metric named only for a
//     multi-metric request; 'B' before the status says a counter no limit bounds
//     saturated (never stored: a replay counted nothing).
//
// Either way every row names its metric: the unnamed rows of a one-metric request
// take req.Metric.
func decode(s string, req *Request, per vocab.Period, nowMs int64) (vocab.Result, byte, error) {
	if isPacked(s) {
		return decodePacked(s, req, per, nowMs)
	}
	var res vocab.Result
	if s == "" {
		return res, 0, fmt.Errorf("%w: empty", ErrBadReply)
	}
	if s[0] == statusReplay {
		res.Replayed = true
		s = s[1:]
	}
	saturated := false
	if s != "" && s[0] == statusSaturated {
		saturated = true
		s = s[1:]
	}
	if s == "H" {
		return res, statusHydrate, nil
	}
	bad := func() (vocab.Result, byte, error) { return vocab.Result{}, 0, fmt.Errorf("%w %q", ErrBadReply, s) }
	head, rest, _ := strings.Cut(s, ";")
	if len(head) != 1 {
		return bad()
	}
	status := head[0]
	var f [3]int64
	for i := range f {
		var field string
		field, rest, _ = strings.Cut(rest, ";")
		v, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return bad()
		}
		f[i] = v
	}
	retry, blocked := f[1], int(f[2])
	if rest != "" {
		res.Levels = make([]vocab.LevelStatus, 0, strings.Count(rest, ";")+1)
	}
	for rest != "" {
		var row string
		row, rest, _ = strings.Cut(rest, ";")
		metric := req.Metric
		if strings.Count(row, "|") == 6 { // a multi-metric request's: metric first
			metric, row, _ = strings.Cut(row, "|")
		}
		var p [6]string
		for i := range 5 {
			var ok bool
			if p[i], row, ok = strings.Cut(row, "|"); !ok {
				return bad()
			}
		}
		p[5] = row
		win, burst, isBucket := strings.Cut(p[2], ":") // a token bucket's "<seconds>:<burst>"
		ls := vocab.LevelStatus{Metric: metric, Level: levelOfLetter(p[0]), ID: p[1], Window: windowOfSeconds(win)}
		var err1, err2, err3, err4 error
		ls.Limit, err1 = strconv.ParseInt(p[3], 10, 64)
		ls.Used, err2 = strconv.ParseInt(p[4], 10, 64)
		reset, err3 := strconv.ParseInt(p[5], 10, 64)
		if isBucket {
			ls.Burst, err4 = strconv.ParseInt(burst, 10, 64)
		}
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil || ls.Level == "" || ls.Window == "" ||
			isBucket && (ls.Burst < 1 || ls.Used < 0 || ls.Window.Duration() == 0) {
			return bad()
		}
		if isBucket {
			bucketLevel(&ls, ls.Used, f[0])
		} else {
			ls.Remaining = max(ls.Limit-ls.Used, 0)
			ls.ResetAt = time.UnixMilli(reset).UTC()
		}
		res.Levels = append(res.Levels, ls)
	}
	if blocked < 0 || blocked > len(res.Levels) {
		return bad()
	}
	if !decided(&res, status, retry, blocked) {
		return bad()
	}
	res.Saturated = saturated
	return res, status, nil
}

// decided fills in the outcome of a parsed reply; false for an unknown status, or a
// denial that names no limit (no script sends one: the engine cannot answer a 429
// without its blocked_at, so it is a reply it cannot read, answered by the fail mode).
func decided(res *vocab.Result, status byte, retry int64, blocked int) bool {
	var b *vocab.Blocked
	if blocked > 0 {
		l := res.Levels[blocked-1]
		b = &vocab.Blocked{Metric: l.Metric, Level: l.Level, ID: l.ID, Window: l.Window}
	}
	switch status {
	case statusAllowed:
		res.Allowed = true
	case statusOver:
		res.Allowed = true
		res.WouldBlock = b
	case statusDenied:
		if b == nil { // a denial always names the limit that refused it (API.md's blocked_at)
			return false
		}
		res.BlockedAt = b
		if retry < retryNever { // never: a cost no bucket can ever hold, no Retry-After
			res.RetryAfter = time.Duration(retry) * time.Millisecond
		}
	default:
		return false
	}
	return true
}

// isPacked tells check.lua's packed decision (little-endian doubles, the first the
// status 1, 2 or 3, whose first byte is 0) from its text replies.
func isPacked(s string) bool { return len(s) >= 24 && len(s)%8 == 0 && s[0] == 0 }

// decodePacked decodes check.lua's packed decision (decode): little-endian doubles,
// status (1 allowed, 2 over a limit but counted, 3 denied; 4 and 5 as 1 and 2, a
// counter no limit bounds saturated), retry (ms), blocked row (1-based), then the used
// value of every row.
// Everything else of a row (level, id, window, limit, reset) is known here from req
// and the clock the check was built at (nowMs), in the order the script walks it, so
// the script formats no numbers.
func decodePacked(s string, req *Request, per vocab.Period, nowMs int64) (vocab.Result, byte, error) {
	var res vocab.Result
	bad := func() (vocab.Result, byte, error) { return vocab.Result{}, 0, fmt.Errorf("%w %q", ErrBadReply, s) }
	// num is the i-th number, or -1 when it is not a whole number in [0, 2^53]
	num := func(i int) int64 {
		f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[8*i : 8*i+8])))
		if !(f >= 0 && f <= 1<<53) || f != math.Trunc(f) {
			return -1
		}
		return int64(f)
	}
	if !isPacked(s) {
		return bad()
	}
	code, retry, blocked := num(0), num(1), num(2)
	if code < 1 || code > 5 || retry < 0 || blocked < 0 {
		return bad()
	}
	// 4 and 5: allowed and over a limit but counted, having saturated a counter no limit
	// bounds (check.lua's "Bounded numbers")
	res.Saturated = code > 3
	status := [...]byte{statusAllowed, statusOver, statusDenied, statusAllowed, statusOver}[code-1]
	n := 0
	for m := range req.metricCount() {
		_, _, ls := req.metricAt(m)
		n += len(ls.Org)
		if req.Team != "" {
			n += len(ls.Team)
			if req.User != "" {
				n += len(ls.User)
			}
		}
	}
	if len(s) != 8*(3+n) || int(blocked) > n {
		return bad()
	}
	res.Levels = make([]vocab.LevelStatus, 0, n)
	month := time.UnixMilli(per.End.UnixMilli()).UTC()
	row := 3
	metric := req.Metric
	level := func(lv vocab.Level, id string, limits []vocab.Limit) bool {
		for _, l := range limits {
			used := num(row)
			if used < 0 {
				return false
			}
			row++
			ls := vocab.LevelStatus{Metric: metric, Level: lv, ID: id, Window: l.Window, Limit: l.Limit, Used: used,
				Remaining: max(l.Limit-used, 0), ResetAt: month}
			if l.Bucket() {
				ls.Burst = l.Burst
				bucketLevel(&ls, used, nowMs)
			} else if l.Window == vocab.Concurrent { // nothing resets on a clock: a slot frees when settled
				ls.ResetAt = time.UnixMilli(nowMs).UTC()
			} else if ms := l.Window.Duration().Milliseconds(); ms > 0 {
				if req.Precise {
					ms /= PreciseSubBuckets // its count next falls at the end of the sub-bucket
				}
				ls.ResetAt = time.UnixMilli(nowMs/ms*ms + ms).UTC()
			}
			res.Levels = append(res.Levels, ls)
		}
		return true
	}
	ok := true
	for m := 0; ok && m < req.metricCount(); m++ {
		var ls *LevelLimits
		metric, _, ls = req.metricAt(m)
		ok = level(vocab.LevelOrg, req.Org, ls.Org)
		if ok && req.Team != "" {
			ok = level(vocab.LevelTeam, req.Team, ls.Team)
			if ok && req.User != "" {
				ok = level(vocab.LevelUser, req.User, ls.User)
			}
		}
	}
	if !ok || !decided(&res, status, retry, int(blocked)) {
		return bad()
	}
	return res, status, nil
}

// retryNever is check.lua's NEVER (2^53): the retry of a denial that no wait can
// turn into an admission (a cost above a token bucket's burst, or a bucket of rate 0).
const retryNever = 1 << 53

// bucketDebtCap is check.lua's GCAP (2^52 us, 142 years): the most debt a token bucket
// keeps, so its TAT stays exact as a double.
const bucketDebtCap = 1 << 52

// bucketLevel fills in a token bucket's level (Window, Limit and Burst set) from its
// debt after the check, in microseconds (check.lua's "Token buckets": how long until
// the bucket is full again, at its rate): the units taken are ceil(debt / T), T = the
// window's microseconds / Limit, exactly (128-bit), so Remaining is the whole tokens
// in the bucket now; ResetAt is when it is full again, to the millisecond above. A
// bucket holds at most bucketDebtCap / T tokens (check.lua's GCAP): the tokens above
// that count as used, never as remaining.
func bucketLevel(ls *vocab.LevelStatus, debtUs, nowMs int64) {
	remaining := int64(0)
	if ls.Limit > 0 {
		d := uint64(ls.Window.Duration().Microseconds())
		depth := uint64(ls.Burst)
		if hi, lo := bits.Mul64(bucketDebtCap, uint64(ls.Limit)); hi < d {
			if q, _ := bits.Div64(hi, lo, d); q < depth {
				depth = q
			}
		}
		hi, lo := bits.Mul64(uint64(debtUs), uint64(ls.Limit))
		if hi < d {
			q, r := bits.Div64(hi, lo, d)
			if r > 0 {
				q++
			}
			if q < depth {
				remaining = int64(depth - q)
			}
		}
	}
	ls.Used, ls.Remaining = ls.Burst-remaining, remaining
	ls.ResetAt = time.UnixMilli(nowMs + (debtUs+999)/1000).UTC()
}

func windowOfSeconds(s string) vocab.Window {
	switch s {
	case "M":
		return vocab.Month
	case "C":
		return vocab.Concurrent
	case "1":
		return vocab.Second
	case "60":
		return vocab.Minute
	case "3600":
		return vocab.Hour
	case "86400":
		return vocab.Day
	}
	return ""
}
