package redact_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/redact"
)

func TestURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"postgres://app:s3cret@db:5432/q?sslmode=disable", "postgres://app:xxxxx@db:5432/q?sslmode=disable"},
		{"redis://:s3cret@r1:6379/0", "redis://:xxxxx@r1:6379/0"},
		{"redis://r1:6379/0", "redis://r1:6379/0"},
		{"redis://user@r1:6379", "redis://user@r1:6379"},
		{"postgres://db/q?password=s3cret&sslmode=require", "postgres://db/q?password=xxxxx&sslmode=require"},
		{"redis://:s3cret@r1:bad-port", "(unparsable url)"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := redact.URL(tt.in); got != tt.want {
			t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestError(t *testing.T) {
	s := "redis://:s3cret@r1:6379/0?token=t0ken"
	got := redact.Error(errors.New("cannot use "+s), s)
	if strings.Contains(got, "s3cret") || strings.Contains(got, "t0ken") || !strings.Contains(got, "xxxxx") {
		t.Errorf("Error = %q", got)
	}
	bad := "redis://:s3cret@r1:bad-port"
	_, err := url.Parse(bad)
	if got := redact.Error(err, bad); strings.Contains(got, "s3cret") {
		t.Errorf("Error of an unparsable url = %q", got)
	}
	if got := redact.Item("pro=redis://:pw@r2"); got != "<redacted>" {
		t.Errorf("Item = %q", got)
	}
}

// A webhook URL's user info is a credential even without a password.
func TestWebhookURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://tok123@hooks.example.com/x":        "https://" + redact.Mask + "@hooks.example.com/x",
		"https://u:p4ss@hooks.example.com/x":        "https://u:" + redact.Mask + "@hooks.example.com/x",
		"https://hooks.example.com/x?token=abc&a=1": "https://hooks.example.com/x?a=1&token=" + redact.Mask,
		"https://hooks.example.com/x":               "https://hooks.example.com/x",
		"":                                          "",
	} {
		if got := redact.WebhookURL(in); got != want {
			t.Errorf("WebhookURL(%q) = %q, want %q", in, got, want)
		}
	}
}
