// Package webhook verifies the webhooks Quotaplane sends, for Go services that
// receive them. It is kept for the programs that import it from the main module;
// new code should import github.com/quotaplane/quotaplane/client/webhook, the
// standard-library-only module this package delegates to (one implementation of the
// signature, shared with the worker that signs the deliveries).
//
// Each delivery is a JSON POST whose Quotaplane-Signature header is
//
//	t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">
//
// keyed with the org's signing secret (GET /v1/orgs/{org}/webhook). Verify checks it
// against the raw body, as received, and refuses a timestamp too far from now, so a
// captured delivery cannot be replayed later.
package webhook

import (
	"time"

	"github.com/quotaplane/quotaplane/client/webhook"
)

// The headers of a delivery.
const (
	SignatureHeader = webhook.SignatureHeader // t=<unix>,v1=<hex>
	EventHeader     = webhook.EventHeader     // the event type, as in the body
	DeliveryHeader  = webhook.DeliveryHeader  // the event id: the same on every retry of one event
)

// DefaultTolerance is how far a signature's timestamp may be from now: deliveries
// are signed when sent, so an older one is a replay (or a clock far off).
const DefaultTolerance = webhook.DefaultTolerance

// The errors of Verify (the client module's, so errors.Is matches either name).
var (
	ErrMalformed = webhook.ErrMalformed
	ErrTimestamp = webhook.ErrTimestamp
	ErrMismatch  = webhook.ErrMismatch
)

// Sign returns the signature header value of body sent at t, keyed with secret.
func Sign(secret string, t time.Time, body []byte) string { return webhook.Sign(secret, t, body) }

// SignAll returns the signature header value of body sent at t with one v1 signature
// per secret, as the worker signs while an org's previous secret is still valid.
func SignAll(secrets []string, t time.Time, body []byte) string {
	return webhook.SignAll(secrets, t, body)
}

// Verify checks header, the value of the Quotaplane-Signature header, against body
// and secret, as webhook.Verify of the client module does: nil when a v1 signature is
// secret's and its timestamp is within tolerance of now; ErrMalformed, ErrTimestamp
// or ErrMismatch otherwise.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	return webhook.Verify(secret, header, body, now, tolerance)
}
