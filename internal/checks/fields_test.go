package checks_test

import (
	"testing"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// AppendPolicyField and AppendLimitField append to a buffer what PolicyField and
// LimitField say, keeping what the buffer held: the transports build an answer's
// header values in one buffer.
func TestAppendFields(t *testing.T) {
	levels := []vocab.LevelStatus{
		{Level: vocab.LevelTeam, Window: vocab.Month, Limit: 600},
		{Metric: "tokens", Level: vocab.LevelUser, Window: vocab.Minute, Limit: 50},
	}
	rl := checks.RateLimit{Level: vocab.LevelStatus{Metric: "tokens", Level: vocab.LevelUser, Window: vocab.Minute}, Remaining: 7, Reset: 12}
	for _, tc := range []struct {
		got, want string
	}{
		{string(checks.AppendPolicyField([]byte("RateLimit-Policy: "), levels, "requests")),
			`RateLimit-Policy: "team-month";q=600, "tokens-user-minute";q=50;w=60;qu="tokens"`},
		{string(checks.AppendPolicyField([]byte("x"), levels, "images")),
			`x"images-team-month";q=600;qu="images", "tokens-user-minute";q=50;w=60;qu="tokens"`},
		{string(checks.AppendPolicyField([]byte("keep"), nil, "requests")), "keep"},
		{string(checks.AppendLimitField([]byte("RateLimit: "), rl)), `RateLimit: "tokens-user-minute";r=7;t=12`},
		{checks.PolicyName("", vocab.LevelOrg, vocab.Day), "org-day"},
		{checks.PolicyName("requests", vocab.LevelUser, vocab.Concurrent), "user-concurrent"},
		{checks.PolicyName("spend", vocab.LevelTeam, vocab.Month), "spend-team-month"},
	} {
		if tc.got != tc.want {
			t.Errorf("%q, want %q", tc.got, tc.want)
		}
	}
}
