// Package webhook verifies the webhooks Quotaplane sends, for Go services that
// receive them: import github.com/quotaplane/quotaplane/client/webhook. It is part of
// the client module and needs only the standard library. It is also the one
// implementation of the signature: the worker signs with Sign, and the main module's
// github.com/quotaplane/quotaplane/webhook package delegates here.
//
// Each delivery is a JSON POST whose Quotaplane-Signature header is
//
//	t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">
//
// keyed with the org's signing secret (GET /v1/orgs/{org}/webhook). Verify checks it
// against the raw body, as received, and refuses a timestamp too far from now, so a
// captured delivery cannot be replayed later.
//
// For a day after the org rotates its secret (POST /v1/orgs/{org}/webhook/secret/rotate)
// a delivery carries two signatures, the new secret's and the previous one's:
//
//	t=<unix seconds>,v1=<hex, new secret>,v1=<hex, previous secret>
//
// and Verify accepts it with either secret, so a receiver can switch at any moment of
// that day.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"time"
)

// The headers of a delivery.
const (
	SignatureHeader = "Quotaplane-Signature" // t=<unix>,v1=<hex>
	EventHeader     = "Quotaplane-Event"     // the event type, as in the body
	DeliveryHeader  = "Quotaplane-Delivery"  // the event id: the same on every retry of one event
)

// DefaultTolerance is how far a signature's timestamp may be from now: deliveries
// are signed when sent, so an older one is a replay (or a clock far off).
const DefaultTolerance = 5 * time.Minute

// The errors of Verify; test for them with errors.Is.
var (
	ErrMalformed = errors.New("malformed signature header")
	ErrTimestamp = errors.New("signature timestamp out of tolerance")
	ErrMismatch  = errors.New("signature mismatch")
)

// Sign returns the signature header value of body sent at t, keyed with secret.
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

// SignAll returns the signature header value of body sent at t with one v1 signature
// per secret, in order: what the worker sends while an org's previous secret is still
// valid after a rotation. With one secret it is Sign.
func SignAll(secrets []string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	var b strings.Builder
	b.WriteString("t=" + ts)
	for _, s := range secrets {
		b.WriteString(",v1=" + mac(s, ts, body))
	}
	return b.String()
}

func mac(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Verify checks header, the value of the Quotaplane-Signature header, against body
// and secret: nil when one of its v1 signatures is secret's (a delivery during a
// secret rotation carries two) and its timestamp is within tolerance of now. It
// returns ErrMalformed for a header without t and v1, ErrTimestamp for a timestamp
// out of tolerance, and ErrMismatch otherwise. body must be the bytes as received,
// before any JSON decoding.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts string
	var sigs []string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			if v != "" {
				sigs = append(sigs, v)
			}
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrMalformed
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrTimestamp
	}
	// The timestamp as Sign writes it: "t=012" is not the "t=12" that was signed.
	canon := strconv.FormatInt(sec, 10)
	want := []byte(mac(secret, canon, body))
	ok := false
	for _, sig := range sigs {
		// Every signature is compared (constant time each), not only up to a match.
		if hmac.Equal(want, []byte(sig)) {
			ok = true
		}
	}
	if !ok || canon != ts {
		return ErrMismatch
	}
	return nil
}
