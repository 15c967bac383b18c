package webhook_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client/webhook"
)

func TestVerify(t *testing.T) {
	const secret = "3af2fb1d0c5e4a8f9b7d6c5e4a3b2c1d"
	body := []byte(`{"id":17,"type":"usage.threshold","org":"demo"}`)
	sent := time.Unix(1763700000, 0)
	header := webhook.Sign(secret, sent, body)
	if !strings.HasPrefix(header, "t=1763700000,v1=") || len(header) != len("t=1763700000,v1=")+64 {
		t.Fatalf("Sign = %q, want t=<unix>,v1=<64 hex digits>", header)
	}
	v1 := strings.TrimPrefix(header, "t=1763700000,v1=")
	if one := webhook.SignAll([]string{secret}, sent, body); one != header {
		t.Errorf("SignAll of one secret = %q, want Sign's %q", one, header)
	}
	cases := []struct {
		name   string
		secret string
		header string
		body   []byte
		now    time.Time
		want   error
	}{
		{"as sent", secret, header, body, sent, nil},
		{"4 minutes later", secret, header, body, sent.Add(4 * time.Minute), nil},
		{"clock 4 minutes behind", secret, header, body, sent.Add(-4 * time.Minute), nil},
		{"fields in another order", secret, "v1=" + v1 + ",t=1763700000", body, sent, nil},
		{"replayed 6 minutes later", secret, header, body, sent.Add(6 * time.Minute), webhook.ErrTimestamp},
		{"timestamp moved", secret, "t=1763700300,v1=" + v1, body, sent.Add(5 * time.Minute), webhook.ErrMismatch},
		{"timestamp with a leading zero", secret, "t=01763700000,v1=" + v1, body, sent, webhook.ErrMismatch},
		{"another org's secret", "another-secret", header, body, sent, webhook.ErrMismatch},
		{"body changed", secret, header, []byte(`{"id":17,"type":"usage.threshold","org":"evil"}`), sent, webhook.ErrMismatch},
		{"body re-encoded", secret, header, []byte(`{"id": 17, "type": "usage.threshold", "org": "demo"}`), sent, webhook.ErrMismatch},
		{"signature truncated", secret, header[:len(header)-2], body, sent, webhook.ErrMismatch},
		{"two signatures, this secret's first", secret, "t=1763700000,v1=" + v1 + ",v1=" + strings.Repeat("0", 64), body, sent, nil},
		{"two signatures, this secret's second", secret, "t=1763700000,v1=" + strings.Repeat("0", 64) + ",v1=" + v1, body, sent, nil},
		{"SignAll, new secret", secret, webhook.SignAll([]string{secret, "previous-secret"}, sent, body), body, sent, nil},
		{"SignAll, previous secret", "previous-secret", webhook.SignAll([]string{secret, "previous-secret"}, sent, body), body, sent, nil},
		{"SignAll, a third secret", "another-secret", webhook.SignAll([]string{secret, "previous-secret"}, sent, body), body, sent, webhook.ErrMismatch},
		{"two signatures, neither this secret's", secret, "t=1763700000,v1=" + strings.Repeat("0", 64) + ",v1=" + strings.Repeat("1", 64), body, sent, webhook.ErrMismatch},
		{"empty header", secret, "", body, sent, webhook.ErrMalformed},
		{"no signature", secret, "t=1763700000", body, sent, webhook.ErrMalformed},
		{"no timestamp", secret, "v1=" + v1, body, sent, webhook.ErrMalformed},
		{"timestamp not a number", secret, "t=soon,v1=" + v1, body, sent, webhook.ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := webhook.Verify(c.secret, c.header, c.body, c.now, webhook.DefaultTolerance)
			if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
				t.Errorf("Verify = %v, want %v", err, c.want)
			}
		})
	}
}
