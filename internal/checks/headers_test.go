package checks_test

import (
	"testing"

	"github.com/dunglas/httpsfv"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The RateLimit-Policy field of a path's limits, as a structured-field library reads
// it: one String-named item per limit (each name once), q the limit, w the window's
// seconds (none for a month or a concurrent limit), qu for units other than requests.
func TestPolicyField(t *testing.T) {
	levels := []vocab.LevelStatus{
		{Level: vocab.LevelOrg, ID: "acme", Window: vocab.Month, Limit: 1000},
		{Level: vocab.LevelUser, ID: "alice", Window: vocab.Second, Limit: 5},
		{Level: vocab.LevelUser, ID: "alice", Window: vocab.Concurrent, Limit: 2},
		{Metric: "tokens", Level: vocab.LevelTeam, ID: "eng", Window: vocab.Hour, Limit: 100000},
		{Metric: "tokens", Level: vocab.LevelUser, ID: "alice", Window: vocab.Concurrent, Limit: 4000},
		{Metric: "gpu", Level: vocab.LevelOrg, ID: "acme", Window: vocab.Day, Limit: 0},
		{Level: vocab.LevelOrg, ID: "acme", Window: vocab.Month, Limit: 1000}, // a second path's org: named once
	}
	field := checks.PolicyField(levels, "requests")
	l, err := httpsfv.UnmarshalList([]string{field})
	if err != nil {
		t.Fatalf("%q: %v", field, err)
	}
	type want struct {
		name string
		q, w int64 // w 0: none
		qu   string
	}
	wants := []want{
		{"org-month", 1000, 0, ""}, {"user-second", 5, 1, ""}, {"user-concurrent", 2, 0, "concurrent-requests"},
		{"tokens-team-hour", 100000, 3600, "tokens"}, {"tokens-user-concurrent", 4000, 0, "tokens"}, {"gpu-org-day", 0, 86400, "gpu"},
	}
	if len(l) != len(wants) {
		t.Fatalf("%q: %d items, want %d", field, len(l), len(wants))
	}
	for i, w := range wants {
		it := l[i].(httpsfv.Item)
		q, _ := it.Params.Get("q")
		wv, hasW := it.Params.Get("w")
		qu, hasQU := it.Params.Get("qu")
		if it.Value != w.name || q != w.q || hasW != (w.w > 0) || (hasW && wv != w.w) || hasQU != (w.qu != "") || (hasQU && qu != w.qu) {
			t.Errorf("item %d = %#v %v, want %+v", i, it.Value, it.Params.Names(), w)
		}
	}
	if checks.PolicyField(nil, "requests") != "" {
		t.Error("no levels: want no field")
	}
}

// The RateLimit field: the policy, r, and t (omitted only for an allowed concurrent
// limit, which frees as holders settle).
func TestLimitField(t *testing.T) {
	for _, tc := range []struct {
		rl   checks.RateLimit
		want string
	}{
		{checks.RateLimit{Level: vocab.LevelStatus{Metric: "requests", Level: vocab.LevelUser, Window: vocab.Minute}, Remaining: 3, Reset: 42}, `"user-minute";r=3;t=42`},
		{checks.RateLimit{Level: vocab.LevelStatus{Metric: "tokens", Level: vocab.LevelOrg, Window: vocab.Month}, Remaining: 0, Reset: 0}, `"tokens-org-month";r=0;t=0`},
		{checks.RateLimit{Level: vocab.LevelStatus{Metric: "requests", Level: vocab.LevelUser, Window: vocab.Concurrent}, Remaining: 1}, `"user-concurrent";r=1`},
		{checks.RateLimit{Level: vocab.LevelStatus{Metric: "requests", Level: vocab.LevelUser, Window: vocab.Concurrent}, Remaining: 0, Reset: 3}, `"user-concurrent";r=0;t=3`},
	} {
		got := checks.LimitField(tc.rl)
		if got != tc.want {
			t.Errorf("LimitField(%+v) = %q, want %q", tc.rl, got, tc.want)
		}
		if _, err := httpsfv.UnmarshalList([]string{got}); err != nil {
			t.Errorf("%q: %v", got, err)
		}
	}
}

func TestParseHeaderMode(t *testing.T) {
	for s, want := range map[string]checks.HeaderMode{"": checks.HeadersBoth, "both": checks.HeadersBoth, "Draft": checks.HeadersDraft,
		"legacy": checks.HeadersLegacy, " off ": checks.HeadersOff} {
		if m, err := checks.ParseHeaderMode(s); err != nil || m != want {
			t.Errorf("ParseHeaderMode(%q) = %v, %v; want %v", s, m, err, want)
		}
	}
	if _, err := checks.ParseHeaderMode("draft-11"); err == nil {
		t.Error("draft-11 accepted")
	}
	if !checks.HeadersBoth.Draft() || !checks.HeadersBoth.Legacy() || checks.HeadersDraft.Legacy() || checks.HeadersLegacy.Draft() ||
		checks.HeadersOff.Draft() || checks.HeadersOff.Legacy() {
		t.Error("Draft and Legacy disagree with the modes")
	}
}
