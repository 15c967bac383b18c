package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/config"
)

func TestAdminRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		n           int
		per         time.Duration
	}{
		{"default", "", 50, time.Second},
		{"per second", "20/s", 20, time.Second},
		{"per minute", "600/m", 600, time.Minute},
		{"per hour, spaced and upper case", " 5000 / H ", 5000, time.Hour},
		{"zero disables", "0", 0, time.Second},
		{"off disables", "off", 0, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.LoadAPI(env(map[string]string{"QUOTA_ADMIN_RATE_LIMIT": tc.value}))
			if err != nil || c.AdminRateLimit != tc.n || c.AdminRateWindow != tc.per {
				t.Fatalf("QUOTA_ADMIN_RATE_LIMIT=%q: %d per %v, %v; want %d per %v", tc.value, c.AdminRateLimit, c.AdminRateWindow, err, tc.n, tc.per)
			}
		})
	}
	for _, bad := range []string{"20", "20/", "/s", "20/d", "20/sec", "-1/s", "0/s", "x/s", "1.5/s", "20/s/m", "on"} {
		_, err := config.LoadAPI(env(map[string]string{"QUOTA_ADMIN_RATE_LIMIT": bad}))
		if err == nil || !strings.Contains(err.Error(), "QUOTA_ADMIN_RATE_LIMIT") || !strings.Contains(err.Error(), "600/m") {
			t.Errorf("QUOTA_ADMIN_RATE_LIMIT=%q: error %v, want one that names the variable and shows the format", bad, err)
		}
	}
}

// QUOTA_RATELIMIT_HEADERS picks the RateLimit header fields: both by default, any case
// and spacing; anything else is refused naming the variable and its values.
func TestRateLimitHeaders(t *testing.T) {
	for value, want := range map[string]string{"": "both", "both": "both", "draft": "draft", " Legacy ": "legacy", "OFF": "off"} {
		c, err := config.LoadAPI(env(map[string]string{"QUOTA_RATELIMIT_HEADERS": value}))
		if err != nil || c.RateLimitHeaders != want {
			t.Errorf("QUOTA_RATELIMIT_HEADERS=%q: %q, %v; want %q", value, c.RateLimitHeaders, err, want)
		}
	}
	for _, bad := range []string{"yes", "draft-11", "none", "legacy,draft"} {
		_, err := config.LoadAPI(env(map[string]string{"QUOTA_RATELIMIT_HEADERS": bad}))
		if err == nil || !strings.Contains(err.Error(), "QUOTA_RATELIMIT_HEADERS") || !strings.Contains(err.Error(), "both, draft, legacy or off") {
			t.Errorf("QUOTA_RATELIMIT_HEADERS=%q: error %v, want one naming the variable and its values", bad, err)
		}
	}
}
