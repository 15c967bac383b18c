package webhook_test

import (
	"errors"
	"testing"
	"time"

	cwebhook "github.com/quotaplane/quotaplane/client/webhook"
	"github.com/quotaplane/quotaplane/webhook"
)

// This package is the client module's webhook under its old import path: the same
// signatures, the same errors.
func TestDelegatesToTheClientModule(t *testing.T) {
	body, now := []byte(`{"id":1}`), time.Unix(1763700000, 0)
	h := webhook.Sign("secret", now, body)
	if h != cwebhook.Sign("secret", now, body) {
		t.Fatalf("Sign = %q, the client's %q", h, cwebhook.Sign("secret", now, body))
	}
	if err := cwebhook.Verify("secret", h, body, now, webhook.DefaultTolerance); err != nil {
		t.Errorf("the client's Verify of this Sign: %v", err)
	}
	if err := webhook.Verify("other", h, body, now, webhook.DefaultTolerance); !errors.Is(err, cwebhook.ErrMismatch) || !errors.Is(err, webhook.ErrMismatch) {
		t.Errorf("Verify with another secret = %v, want ErrMismatch under both names", err)
	}
	if err := webhook.Verify("secret", h, body, now.Add(time.Hour), webhook.DefaultTolerance); !errors.Is(err, cwebhook.ErrTimestamp) {
		t.Errorf("Verify an hour later = %v, want ErrTimestamp", err)
	}
}
