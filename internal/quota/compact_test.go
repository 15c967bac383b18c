package quota

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// check.lua's packed decision is decoded against the request, and anything that is
// not exactly such a decision is refused rather than read as one.
func TestParseCompact(t *testing.T) {
	req := Request{Org: "acme", Team: "eng", User: "ann", Metric: "requests", Cost: 1,
		Limits: LevelLimits{Org: []vocab.Limit{{Window: vocab.Month, Limit: 100}}, User: []vocab.Limit{{Window: vocab.Minute, Limit: 5}}}}
	per := vocab.PeriodAt(time.UnixMilli(1_790_000_000_000), 1)
	nowMs := int64(1_790_000_030_500)
	pack := func(vs ...float64) string { return string(appendNumbers(nil, vs...)) }

	res, st, err := decodePacked(pack(3, 1500, 2, 40, 5), &req, per, nowMs)
	if err != nil || st != statusDenied {
		t.Fatalf("denied decision: %v, status %q", err, st)
	}
	if res.Allowed || res.BlockedAt == nil || res.BlockedAt.Level != vocab.LevelUser || res.RetryAfter != 1500*time.Millisecond {
		t.Errorf("denied decision read as %+v", res)
	}
	if l := res.Levels[1]; l.Used != 5 || l.Remaining != 0 || !l.ResetAt.Equal(time.UnixMilli(1_790_000_040_000)) {
		t.Errorf("minute row %+v, want used 5, remaining 0, reset at the bucket's end", l)
	}
	if l := res.Levels[0]; l.Used != 40 || l.Remaining != 60 || !l.ResetAt.Equal(per.End) {
		t.Errorf("month row %+v, want used 40, remaining 60, reset at the period's end", l)
	}
	if res, st, err := decodePacked(pack(1, 0, 0, 41, 5), &req, per, nowMs); err != nil || st != statusAllowed || !res.Allowed {
		t.Errorf("allowed decision: %+v, %q, %v", res, st, err)
	}
	// 4 and 5: allowed and over a limit but counted, a counter no limit bounds saturated
	if res, st, err := decodePacked(pack(4, 0, 0, 41, 5), &req, per, nowMs); err != nil || st != statusAllowed || !res.Allowed || !res.Saturated {
		t.Errorf("allowed, saturated: %+v, %q, %v", res, st, err)
	}
	if res, st, err := decodePacked(pack(5, 0, 2, 41, 6), &req, per, nowMs); err != nil || st != statusOver || !res.Allowed ||
		!res.Saturated || res.WouldBlock == nil {
		t.Errorf("over but counted, saturated: %+v, %q, %v", res, st, err)
	}
	// the text reply: 'B' first says saturated; a denial naming no row is malformed
	if res, st, err := decode("BA;1;0;0;o|acme|M|100|41|0", &req, per, nowMs); err != nil || st != statusAllowed || !res.Saturated {
		t.Errorf("text, saturated: %+v, %q, %v", res, st, err)
	}
	if _, _, err := decode("D;1;1000;0;o|acme|M|100|41|0", &req, per, nowMs); err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Errorf("text denial naming no row: %v, want a malformed reply", err)
	}

	for name, s := range map[string]string{
		"too few rows":         pack(1, 0, 0, 41),
		"too many rows":        pack(1, 0, 0, 41, 5, 6),
		"unknown status":       pack(6, 0, 0, 41, 5),
		"denial naming no row": pack(3, 10, 0, 41, 5),
		"blocked past rows":    pack(3, 10, 3, 41, 5),
		"negative usage":       pack(1, 0, 0, -1, 5),
		"fraction":             pack(1, 0, 0, 41.5, 5),
		"not whole doubles":    pack(1, 0, 0, 41, 5)[:39],
		"text":                 "A;0;0;0",
		"empty":                "",
	} {
		if _, _, err := decodePacked(s, &req, per, nowMs); err == nil || !strings.Contains(err.Error(), "malformed") {
			t.Errorf("%s: %v, want a malformed reply", name, err)
		}
	}
}
