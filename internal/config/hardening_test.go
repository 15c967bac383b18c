package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/config"
)

// The hardening settings: /metrics off the public listener by default, the sign-in
// limits (never off), the per-org admin limit and the key cap.
func TestHardeningSettings(t *testing.T) {
	c, err := config.LoadAPI(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	h := c.Hardening
	if h.MetricsAddr != config.DefaultMetricsAddr || h.MetricsPublic || h.ConsoleSecureCookies || h.PasswordHashes != 0 ||
		h.SignInRate != 10 || h.SignInWindow != time.Second || h.SignInIPRate != 30 || h.SignInIPWindow != time.Minute ||
		h.AdminOrgRateLimit != 100 || h.AdminOrgRateWindow != time.Second || h.MaxKeysPerOrg != 100 || h.TrustedProxies.String() != "" {
		t.Errorf("defaults = %+v", h)
	}
	c, err = config.LoadAPI(env(map[string]string{"QUOTA_METRICS_ADDR": "public", "QUOTA_TRUSTED_PROXIES": "10.0.0.0/8,127.0.0.1",
		"QUOTA_CONSOLE_SECURE_COOKIES": "on", "QUOTA_PASSWORD_HASHES": "2", "QUOTA_SIGNIN_RATE_LIMIT": "5/s",
		"QUOTA_ADMIN_ORG_RATE_LIMIT": "off", "QUOTA_MAX_KEYS_PER_ORG": "7"}))
	if err != nil {
		t.Fatal(err)
	}
	h = c.Hardening
	if !h.MetricsPublic || h.MetricsAddr != "" || !h.ConsoleSecureCookies || h.PasswordHashes != 2 || h.SignInRate != 5 ||
		h.AdminOrgRateLimit != 0 || h.MaxKeysPerOrg != 7 || h.TrustedProxies.String() != "10.0.0.0/8,127.0.0.1/32" {
		t.Errorf("set = %+v", h)
	}
	if c, err = config.LoadAPI(env(map[string]string{"QUOTA_METRICS_ADDR": "off"})); err != nil || c.MetricsAddr != "" || c.MetricsPublic {
		t.Errorf("off = %+v, %v", c.Hardening, err)
	}
	_, err = config.LoadAPI(env(map[string]string{"QUOTA_METRICS_ADDR": "9090", "QUOTA_TRUSTED_PROXIES": "ingress",
		"QUOTA_SIGNIN_RATE_LIMIT": "off", "QUOTA_SIGNIN_IP_RATE_LIMIT": "0", "QUOTA_PASSWORD_HASHES": "0", "QUOTA_MAX_KEYS_PER_ORG": "0",
		"QUOTA_CONSOLE_SECURE_COOKIES": "yes"}))
	for _, want := range []string{"QUOTA_METRICS_ADDR", "QUOTA_TRUSTED_PROXIES", "QUOTA_SIGNIN_RATE_LIMIT", "QUOTA_SIGNIN_IP_RATE_LIMIT",
		"QUOTA_PASSWORD_HASHES", "QUOTA_MAX_KEYS_PER_ORG", "QUOTA_CONSOLE_SECURE_COOKIES"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}
