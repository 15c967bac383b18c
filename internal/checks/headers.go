package checks

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The RateLimit header fields of draft-ietf-httpapi-ratelimit-headers-11, beside the
// legacy RateLimit-Limit, -Remaining and -Reset of its draft-06 (which clients of
// express-rate-limit's "draft-6" and most gateways still read):
//
//	RateLimit-Policy: "org-month";q=1000, "team-minute";q=100;w=60, "user-minute";q=20;w=60
//	RateLimit: "user-minute";r=0;t=42
//
// RateLimit-Policy has one item per limit of the check's path (each level and window
// with a limit, of every metric); RateLimit one item, the tightest: the limit the
// legacy fields describe, with r = RateLimit-Remaining and t = RateLimit-Reset (on a
// denial, Retry-After). Names (PolicyName) are "<level>-<window>", prefixed by
// "<metric>-" when the metric is not "requests": stable over a sequence of answers to
// one caller, as the draft asks. w is the window in seconds; a month (whose length
// depends on the calendar and the billing anchor) and a concurrent limit (no span of
// time) have none. qu, the unit, is omitted for requests (the draft's default), is
// "concurrent-requests" for a concurrent limit of requests, else the metric's own
// name (the draft's registry knows only requests, content-bytes and
// concurrent-requests; a client that does not know the unit must not take tokens for
// requests). There is no pk: a path's quota is the org's, team's and user's the
// request names itself, so a partition key would add nothing a caller does not know,
// and ids are not put in headers an intermediary may log.

// HeaderMode says which generations of RateLimit header fields answers carry
// (QUOTA_RATELIMIT_HEADERS).
type HeaderMode uint8

// The generations: Draft (RateLimit-Policy and RateLimit), Legacy (RateLimit-Limit,
// -Remaining, -Reset). The zero HeaderMode is HeadersBoth.
const (
	HeadersBoth   HeaderMode = 0
	HeadersDraft  HeaderMode = 1
	HeadersLegacy HeaderMode = 2
	HeadersOff    HeaderMode = 3
)

// String is the mode's QUOTA_RATELIMIT_HEADERS value.
func (m HeaderMode) String() string {
	for k, v := range HeaderModes {
		if v == m {
			return k
		}
	}
	return fmt.Sprintf("HeaderMode(%d)", uint8(m))
}

// Draft reports whether the draft-11 fields are sent.
func (m HeaderMode) Draft() bool { return m == HeadersBoth || m == HeadersDraft }

// Legacy reports whether RateLimit-Limit, -Remaining and -Reset are sent.
func (m HeaderMode) Legacy() bool { return m == HeadersBoth || m == HeadersLegacy }

// HeaderModes are the values of QUOTA_RATELIMIT_HEADERS.
var HeaderModes = map[string]HeaderMode{"both": HeadersBoth, "draft": HeadersDraft, "legacy": HeadersLegacy, "off": HeadersOff}

// ParseHeaderMode reads QUOTA_RATELIMIT_HEADERS: both (also ""), draft, legacy or off.
func ParseHeaderMode(s string) (HeaderMode, error) {
	if s == "" {
		return HeadersBoth, nil
	}
	m, ok := HeaderModes[strings.ToLower(strings.TrimSpace(s))]
	if !ok {
		return HeadersBoth, fmt.Errorf("%q: want both, draft, legacy or off", s)
	}
	return m, nil
}

// defaultMetric is the metric of a check that names none: its policies' names omit it.
const defaultMetric = "requests"

// PolicyName names a limit in RateLimit-Policy, RateLimit and a denial's
// violated-policies: "user-minute", or "tokens-user-minute" for a metric other than
// requests.
func PolicyName(metric string, level vocab.Level, window vocab.Window) string {
	if metric == "" || metric == defaultMetric {
		return string(level) + "-" + string(window)
	}
	return metric + "-" + string(level) + "-" + string(window)
}

// appendPolicyName appends PolicyName as a structured-field String. Metric ids are
// [A-Za-z0-9._:@-] (vocab.ValidID), levels and windows plain words: nothing to escape.
func appendPolicyName(b []byte, metric string, level vocab.Level, window vocab.Window) []byte {
	b = append(b, '"')
	if metric != "" && metric != defaultMetric {
		b = append(b, metric...)
		b = append(b, '-')
	}
	b = append(b, level...)
	b = append(b, '-')
	b = append(b, window...)
	return append(b, '"')
}

// PolicyField is the RateLimit-Policy field of levels: one item per limit, in order,
// each name once (the first); metric is the metric of levels that do not name theirs.
// "" when levels is empty.
func PolicyField(levels []vocab.LevelStatus, metric string) string {
	return string(AppendPolicyField(make([]byte, 0, 40*len(levels)), levels, metric))
}

// AppendPolicyField appends PolicyField's value to b: the transports build all of an
// answer's header values in one buffer, one allocation.
func AppendPolicyField(b []byte, levels []vocab.LevelStatus, metric string) []byte {
	start := len(b)
	metricOf := func(l *vocab.LevelStatus) string {
		if l.Metric == "" {
			return metric
		}
		return l.Metric
	}
	for i := range levels {
		l := &levels[i]
		m := metricOf(l)
		if slices.ContainsFunc(levels[:i], func(o vocab.LevelStatus) bool { // named already (another path's)
			return o.Level == l.Level && o.Window == l.Window && metricOf(&o) == m
		}) {
			continue
		}
		if len(b) > start {
			b = append(b, ", "...)
		}
		b = appendPolicyName(b, m, l.Level, l.Window)
		b = append(b, ";q="...)
		b = strconv.AppendInt(b, l.Limit, 10)
		if d := l.Window.Duration(); d > 0 {
			b = append(b, ";w="...)
			b = strconv.AppendInt(b, int64(d.Seconds()), 10)
		}
		switch {
		case l.Window == vocab.Concurrent && (m == "" || m == defaultMetric):
			b = append(b, `;qu="concurrent-requests"`...)
		case m != "" && m != defaultMetric:
			b = append(b, ";qu="...)
			b = strconv.AppendQuote(b, m)
		}
	}
	return b
}

// LimitField is the RateLimit field of rl: its policy, r its remaining units and t
// its reset in seconds (omitted for an allowed concurrent limit, which frees as its
// holders settle, not on a clock).
func LimitField(rl RateLimit) string {
	return string(AppendLimitField(make([]byte, 0, 48), rl))
}

// AppendLimitField appends LimitField's value to b.
func AppendLimitField(b []byte, rl RateLimit) []byte {
	b = appendPolicyName(b, rl.Level.Metric, rl.Level.Level, rl.Level.Window)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, rl.Remaining, 10)
	if rl.Level.Window != vocab.Concurrent || rl.Reset > 0 {
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, rl.Reset, 10)
	}
	return b
}

// Violated is the name of the policy that denied d ("" when d was allowed): the one
// item of a denial's violated-policies.
func (d *Decision) Violated() string {
	b := d.Result.BlockedAt
	if d.Result.Allowed || b == nil {
		return ""
	}
	m := b.Metric
	if m == "" {
		m = d.Metric
	}
	return PolicyName(m, b.Level, b.Window)
}
