package httpapi

import (
	"bytes"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
)

// The check route's JSON by hand. encoding/json's reflection (decoding the request,
// encoding the answer) was about a tenth of the api's CPU per check in profiles
// (docs/PERFORMANCE.md). The hand-written code covers the common shapes only and
// hands everything else to decodeStrict (strictjson.go: field names exactly as the
// contract spells them, then encoding/json), so both accept exactly the same bodies,
// decoded alike, and every refusal is worded by decodeStrict; TestCheckJSON and the
// fuzz tests compare the two.

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 2048); return &b }}

// decodeCheck reads a CheckRequest like decode (strict, one object, 1 MiB cap), by hand
// when the body is a flat object of known fields with plain values.
func decodeCheck(w http.ResponseWriter, r *http.Request, in *api.CheckRequest) bool {
	return decodeFast(w, r, func(b []byte) bool { return parseCheckRequest(b, in) }, func(b []byte) error {
		*in = api.CheckRequest{}
		return decodeInto(b, in, checkShape)
	})
}

// decodeBatch reads a BatchCheckRequest the same way.
func decodeBatch(w http.ResponseWriter, r *http.Request, in *api.BatchCheckRequest) bool {
	return decodeFast(w, r, func(b []byte) bool { return parseBatchRequest(b, in) }, func(b []byte) error {
		*in = api.BatchCheckRequest{}
		return decodeInto(b, in, batchShape)
	})
}

// decodeInto is decodeStrict into a value of its own, copied to v: v itself is never
// handed to encoding/json, so a caller's value stays on its stack on the fast path.
func decodeInto[T any](b []byte, v *T, sh *shape) error {
	var into T
	err := decodeStrict(b, &into, sh)
	*v = into
	return err
}

// decodeFast refuses a Content-Type that jsonBody does not admit (415), reads the body
// and tries parse on it; when parse declines, slow (decodeBytes: encoding/json, into
// a reset value) reads the same bytes, and words any refusal in the API's terms.
func decodeFast(w http.ResponseWriter, r *http.Request, parse func([]byte) bool, slow func([]byte) error) bool {
	if ct := r.Header.Get("Content-Type"); !jsonBody(ct) {
		refuse(w, r, errUnsupportedMediaType(ct))
		return false
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := bytes.NewBuffer((*bp)[:0])
	_, err := buf.ReadFrom(r.Body)
	if buf.Cap() <= 64<<10 { // a huge body's buffer is not kept
		*bp = buf.Bytes()[:0]
	}
	switch {
	case err != nil:
		if tooBig := (*http.MaxBytesError)(nil); errors.As(err, &tooBig) {
			err = errTooLarge
		} else {
			err = derrors.E(derrors.Invalid, "request body could not be read", err)
		}
	case parse(buf.Bytes()):
		return true
	default:
		err = slow(buf.Bytes())
	}
	if err != nil {
		refuse(w, r, err)
		return false
	}
	return true
}

// parseCheckRequest parses {"org":"acme","user":"u1","cost":1,...}: string fields whose
// characters need no escaping, an integer cost, each field at most once. It returns
// false for anything else, valid or not, and encoding/json decides.
//
// The body is copied once into a string, and every string field is a part of it: one
// allocation for all of them, and one for the optional fields' values (fieldsOf), not
// one per field (BenchmarkDecodeCheckRequest).
func parseCheckRequest(body []byte, in *api.CheckRequest) bool {
	b := string(body)
	i, ok := parseCheckObject(b, skipSpace(b, 0), in)
	return ok && skipSpace(b, i) == len(b)
}

// parseBatchRequest parses {"checks":[<check>,...]} the same way.
func parseBatchRequest(body []byte, in *api.BatchCheckRequest) bool {
	b := string(body)
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	key, i, ok := plainString(b, skipSpace(b, i+1))
	if !ok || key != "checks" {
		return false
	}
	if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
		return false
	}
	if i = skipSpace(b, i+1); i >= len(b) || b[i] != '[' {
		return false
	}
	in.Checks = make([]api.CheckRequest, 0, 16)
	if i = skipSpace(b, i+1); i < len(b) && b[i] == ']' {
		i++
	} else {
		for {
			in.Checks = append(in.Checks, api.CheckRequest{})
			if i, ok = parseCheckObject(b, i, &in.Checks[len(in.Checks)-1]); !ok {
				return false
			}
			if i = skipSpace(b, i); i >= len(b) {
				return false
			}
			if b[i] == ']' {
				i++
				break
			}
			if b[i] != ',' {
				return false
			}
			i = skipSpace(b, i+1)
		}
	}
	if i = skipSpace(b, i); i >= len(b) || b[i] != '}' {
		return false
	}
	return skipSpace(b, i+1) == len(b)
}

// parseCheckObject parses one check object starting at b[i] and returns the index after it.
func parseCheckObject(b string, i int, in *api.CheckRequest) (int, bool) {
	if i >= len(b) || b[i] != '{' {
		return i, false
	}
	i = skipSpace(b, i+1)
	var seen [6]bool
	var vals *checkFields // the optional fields' values, allocated at the first
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		key, j, ok := plainString(b, i)
		if !ok {
			return i, false
		}
		j = skipSpace(b, j)
		if j >= len(b) || b[j] != ':' {
			return i, false
		}
		j = skipSpace(b, j+1)
		field := -1
		switch key {
		case "org":
			field = 0
		case "team":
			field = 1
		case "user":
			field = 2
		case "metric":
			field = 3
		case "idempotency_key":
			field = 4
		case "cost":
			field = 5
		}
		if field < 0 || seen[field] {
			return i, false
		}
		seen[field] = true
		if field == 5 {
			k := j
			if k < len(b) && b[k] == '-' {
				k++
			}
			start := k
			for k < len(b) && b[k] >= '0' && b[k] <= '9' {
				k++
			}
			if k == start || (b[start] == '0' && k-start > 1) {
				return i, false
			}
			n, err := strconv.ParseInt(b[j:k], 10, 64)
			if err != nil {
				return i, false
			}
			vals = fieldsOf(vals)
			vals.cost = n
			in.Cost, j = &vals.cost, k
		} else {
			v, k, ok := plainString(b, j)
			if !ok {
				return i, false
			}
			if field > 0 {
				vals = fieldsOf(vals)
				vals.s[field-1] = v
			}
			switch field {
			case 0:
				in.Org = v
			case 1:
				in.Team = &vals.s[0]
			case 2:
				in.User = &vals.s[1]
			case 3:
				in.Metric = &vals.s[2]
			case 4:
				in.IdempotencyKey = &vals.s[3]
			}
			j = k
		}
		j = skipSpace(b, j)
		if j >= len(b) {
			return i, false
		}
		switch b[j] {
		case ',':
			i = skipSpace(b, j+1)
		case '}':
			return j + 1, true
		default:
			return i, false
		}
	}
}

// checkFields holds the values of a check's optional fields, which the request points
// to: one allocation for all of them.
type checkFields struct {
	s    [4]string // team, user, metric, idempotency_key
	cost int64
}

func fieldsOf(v *checkFields) *checkFields {
	if v == nil {
		v = new(checkFields)
	}
	return v
}

func skipSpace(b string, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at b[i] made only of printable ASCII without
// escapes, and returns it and the index after it.
func plainString(b string, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", i, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", i, false
		}
	}
	return "", i, false
}

// writeCheckResult writes out as encoding/json's Encoder would, without reflection.
func writeCheckResult(w http.ResponseWriter, status int, out *api.CheckResult) {
	bp := bufPool.Get().(*[]byte)
	b := appendCheckResult((*bp)[:0], out)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, _ = w.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
	}
	bufPool.Put(bp)
}

// writeBatchResult writes {"results":[...]} as encoding/json would: each item is
// already JSON (appendCheckResult's, or a problem by encoding/json).
func writeBatchResult(w http.ResponseWriter, items []api.BatchCheckItem) {
	bp := bufPool.Get().(*[]byte)
	b := append((*bp)[:0], `{"results":[`...)
	for i := range items {
		if i > 0 {
			b = append(b, ',')
		}
		raw, _ := items[i].MarshalJSON()
		b = append(b, raw...)
	}
	b = append(b, "]}\n"...)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
	if cap(b) <= 64<<10 {
		*bp = b[:0]
	}
	bufPool.Put(bp)
}

// appendCheckResult appends out as encoding/json would encode it (fields in struct
// order, omitempty, RFC 3339 times, <, > and & unescaped), then a newline like Encoder.
func appendCheckResult(b []byte, out *api.CheckResult) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, out.Allowed)
	if out.BlockedAt != nil {
		b = append(b, `,"blocked_at":`...)
		b = appendLevelRef(b, out.BlockedAt)
	}
	if out.Degraded != nil {
		b = append(b, `,"degraded":`...)
		b = strconv.AppendBool(b, *out.Degraded)
	}
	if out.Leased != nil {
		b = append(b, `,"leased":`...)
		b = strconv.AppendBool(b, *out.Leased)
	}
	if out.Levels == nil {
		b = append(b, `,"levels":null`...)
	} else {
		b = append(b, `,"levels":[`...)
		for i := range out.Levels {
			l := &out.Levels[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, '{')
			if l.Burst != nil {
				b = append(b, `"burst":`...)
				b = strconv.AppendInt(b, *l.Burst, 10)
				b = append(b, ',')
			}
			b = append(b, `"id":`...)
			b = appendString(b, l.Id)
			b = append(b, `,"level":`...)
			b = appendString(b, string(l.Level))
			b = append(b, `,"limit":`...)
			b = strconv.AppendInt(b, l.Limit, 10)
			if l.Metric != nil {
				b = append(b, `,"metric":`...)
				b = appendString(b, *l.Metric)
			}
			b = append(b, `,"remaining":`...)
			b = strconv.AppendInt(b, l.Remaining, 10)
			b = append(b, `,"reset_at":`...)
			b = appendTime(b, l.ResetAt)
			b = append(b, `,"used":`...)
			b = strconv.AppendInt(b, l.Used, 10)
			b = append(b, `,"window":`...)
			b = appendString(b, string(l.Window))
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = append(b, `,"mode":`...)
	b = appendString(b, string(out.Mode))
	if out.Replayed != nil {
		b = append(b, `,"replayed":`...)
		b = strconv.AppendBool(b, *out.Replayed)
	}
	if out.RetryAfterSeconds != nil {
		b = append(b, `,"retry_after_seconds":`...)
		b = strconv.AppendInt(b, *out.RetryAfterSeconds, 10)
	}
	if t := out.Throttled; t != nil {
		b = append(b, `,"throttled":{"expires_at":`...)
		b = appendTime(b, t.ExpiresAt)
		b = append(b, `,"factor":`...)
		b = strconv.AppendFloat(b, t.Factor, 'f', -1, 64) // as encoding/json writes 1e-6 <= factor <= 1
		b = append(b, `,"scope":`...)
		b = appendString(b, string(t.Scope))
		b = append(b, '}')
	}
	if out.ViolatedPolicies != nil {
		b = append(b, `,"violated-policies":[`...)
		for i, v := range *out.ViolatedPolicies {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, v)
		}
		b = append(b, ']')
	}
	if out.Warning != nil {
		b = append(b, `,"warning":`...)
		b = appendString(b, *out.Warning)
	}
	if out.WouldBlock != nil {
		b = append(b, `,"would_block":`...)
		b = appendLevelRef(b, out.WouldBlock)
	}
	return append(b, "}\n"...)
}

func appendLevelRef(b []byte, r *api.LevelRef) []byte {
	b = append(b, '{')
	if r.FairShare != nil {
		b = append(b, `"fair_share":`...)
		b = strconv.AppendBool(b, *r.FairShare)
		b = append(b, ',')
	}
	b = append(b, `"id":`...)
	b = appendString(b, r.Id)
	b = append(b, `,"level":`...)
	b = appendString(b, string(r.Level))
	if r.Metric != nil {
		b = append(b, `,"metric":`...)
		b = appendString(b, *r.Metric)
	}
	b = append(b, `,"window":`...)
	b = appendString(b, string(r.Window))
	return append(b, '}')
}

// appendString quotes s directly when no character needs escaping (ids never do), and
// through encoding/json otherwise, <, > and & left as they are as writeJSON leaves them.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			var q bytes.Buffer
			_ = problem.Encoder(&q).Encode(s)
			return append(b, bytes.TrimSuffix(q.Bytes(), []byte("\n"))...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendTime is time.Time's MarshalJSON (reset times are always within years 0-9999).
// jsonContentType is the check answers' Content-Type header value, shared: net/http
// only reads it.
var jsonContentType = []string{"application/json"}

// appendTime writes t as encoding/json does (RFC 3339 with nanoseconds, trailing zeros
// dropped), by hand for what the answers hold, UTC whole seconds in years 0-9999.
func appendTime(b []byte, t time.Time) []byte {
	if t.Location() != time.UTC || t.Nanosecond() != 0 || t.Year() < 0 || t.Year() > 9999 {
		b = append(b, '"')
		b = t.AppendFormat(b, time.RFC3339Nano)
		return append(b, '"')
	}
	year, month, day := t.Date()
	hour, min, sec := t.Clock()
	two := func(b []byte, v int) []byte { return append(b, byte('0'+v/10), byte('0'+v%10)) }
	b = append(b, '"')
	b = two(b, year/100)
	b = two(b, year%100)
	b = append(b, '-')
	b = two(b, int(month))
	b = append(b, '-')
	b = two(b, day)
	b = append(b, 'T')
	b = two(b, hour)
	b = append(b, ':')
	b = two(b, min)
	b = append(b, ':')
	b = two(b, sec)
	return append(b, 'Z', '"')
}
