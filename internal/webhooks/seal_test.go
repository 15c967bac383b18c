package webhooks

import (
	"strings"
	"testing"
)

// A sealed secret opens only with the master and the org it was sealed for: a row
// copied to another org, or read by a server with another QUOTA_WEBHOOK_SECRET, is an
// error, never a wrong secret that signs.
func TestSealedSecretOpensOnlyForItsOrgAndMaster(t *testing.T) {
	master := []byte("seal-test-master-secret")
	secret, err := newSecret()
	if err != nil || len(secret) != 64 {
		t.Fatalf("newSecret = %q, %v", secret, err)
	}
	sealed, err := seal(master, "acme", secret)
	if err != nil || strings.Contains(sealed, secret) {
		t.Fatalf("seal = %q, %v", sealed, err)
	}
	if again, _ := seal(master, "acme", secret); again == sealed {
		t.Error("two seals of one secret are equal: the nonce is not random")
	}
	if got, err := unseal(master, "acme", sealed); err != nil || got != secret {
		t.Errorf("unseal = %q, %v; want the secret", got, err)
	}
	for name, open := range map[string]func() (string, error){
		"another org":    func() (string, error) { return unseal(master, "other", sealed) },
		"another master": func() (string, error) { return unseal([]byte("another-master-secret"), "acme", sealed) },
		"not base64":     func() (string, error) { return unseal(master, "acme", "!!") },
		"too short":      func() (string, error) { return unseal(master, "acme", "AAAA") },
	} {
		if got, err := open(); err == nil || got != "" {
			t.Errorf("%s: unseal = %q, %v; want an error", name, got, err)
		}
	}
}
