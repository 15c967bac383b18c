package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// ErrUnavailable marks a call that got no decision: Quotaplane could not be reached,
// or answered 5xx, on every attempt, or the call's budget ran out. Test for it with
// errors.Is; when the last attempt was answered, errors.As finds its *Error too. It
// is what a FailPolicy decides on.
var ErrUnavailable = errors.New("quotaplane unavailable")

// ErrConfiguration marks an error no retry can mend and no fail policy should hide:
// a base URL that is not http(s), a server certificate that does not verify, a TLS
// handshake refused, a host name that does not exist (DNS NXDOMAIN). Such a call is
// tried once and returns the error; errors.As finds the cause (a
// *tls.CertificateVerificationError, a *net.DNSError, ...). The API's own refusals
// (401 bad key, 403 missing scope, other 4xx) are a *Error, returned the same way.
var ErrConfiguration = errors.New("quotaplane client misconfigured")

// isConfigError reports whether err, a transport error, is one no retry mends.
func isConfigError(err error) bool {
	var (
		dns    *net.DNSError
		verify *tls.CertificateVerificationError
		unk    x509.UnknownAuthorityError
		host   x509.HostnameError
		inv    x509.CertificateInvalidError
		alert  tls.AlertError
		record tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &dns):
		return dns.IsNotFound
	case errors.As(err, &verify), errors.As(err, &unk), errors.As(err, &host), errors.As(err, &inv),
		errors.As(err, &alert), errors.As(err, &record):
		return true
	}
	return strings.Contains(err.Error(), "unsupported protocol scheme")
}

// Problem is an RFC 9457 problem document, as the API answers every error.
type Problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []FieldError `json:"errors,omitempty"` // what is at fault, for a 400
	// ViolatedPolicies, on a 429 of the admin rate limit, names the exceeded
	// RateLimit-Policy item ("admin"), as draft-11's quota-exceeded type defines.
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// FieldError names a field of the request, by its path ("checks[3].cost"), and what
// is wrong with it.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error is an answer of the API that is neither a decision nor a success: a 4xx (bad
// input 400, bad key 401, missing scope 403, not found 404, conflict 409, a rule
// broken 422, ...) or a 5xx. Find it with errors.As.
type Error struct {
	StatusCode int
	Problem    Problem
	RetryAfter time.Duration // the Retry-After header, if any (a 503): seconds or an HTTP date
}

// Error says the status, its title and the problem's detail.
func (e *Error) Error() string {
	msg := fmt.Sprintf("quotaplane: %d %s", e.StatusCode, e.Problem.Title)
	if e.Problem.Detail != "" {
		msg += ": " + e.Problem.Detail
	}
	return msg
}

// errorOf is the *Error of an answer: its problem document, or, when the body is not
// one (a proxy's 502 page), a problem made of the status and the body's start.
func errorOf(r *reply) *Error {
	e := &Error{StatusCode: r.status, RetryAfter: retryAfter(r.header.Get("Retry-After"))}
	if json.Unmarshal(r.body, &e.Problem) != nil || e.Problem.Status == 0 {
		detail := strings.TrimSpace(string(r.body))
		if len(detail) > 200 {
			detail = detail[:200] + "..."
		}
		e.Problem = Problem{Type: "about:blank", Title: http.StatusText(r.status), Status: r.status, Detail: detail}
	}
	return e
}

// FailPolicy decides a check (or a reservation, as a check of its amount) that
// Quotaplane could not decide, given why (an error wrapping ErrUnavailable; never the
// caller's cancellation, never a configuration error): true
// allows it. Its result has NotDecided set and Cause holding err. FailOpen and
// FailClosed are the two fixed policies; a function can decide by the request, e.g.
// open for reads and closed for costly work.
type FailPolicy func(ctx context.Context, req CheckRequest, err error) bool

// FailOpen allows every check Quotaplane could not decide.
func FailOpen(context.Context, CheckRequest, error) bool { return true }

// FailClosed denies every check Quotaplane could not decide.
func FailClosed(context.Context, CheckRequest, error) bool { return false }
