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

func mac(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Verify checks header, the value of the Quotaplane-Signature header, against body
// and secret: nil when the signature is secret's and its timestamp is within
// tolerance of now. It returns ErrMalformed for a header without t and v1,
// ErrTimestamp for a timestamp out of tolerance, and ErrMismatch otherwise. body must
// be the bytes as received, before any JSON decoding.
func Verify(secret, header string, body []byte, now time.Time, tolerance time.Duration) error {
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return ErrMalformed
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrTimestamp
	}
	// The timestamp as Sign writes it: "t=012" is not the "t=12" that was signed.
	want := Sign(secret, time.Unix(sec, 0), body)
	if !hmac.Equal([]byte(want), []byte("t="+ts+",v1="+sig)) {
		return ErrMismatch
	}
	return nil
}
