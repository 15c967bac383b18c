package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/quotaplane/quotaplane/client/webhook"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Webhook headers, from the public package receivers verify with. The signature is
// HMAC-SHA256, keyed with the org's signing secret, over "<timestamp>.<body>", so a
// receiver can refuse replays of old deliveries:
//
//	Quotaplane-Signature: t=1763700000,v1=<hex>
const (
	SignatureHeader = webhook.SignatureHeader
	EventHeader     = webhook.EventHeader
	DeliveryHeader  = webhook.DeliveryHeader
)

// SigningSecret is the key an org's webhooks are signed with until its first rotation
// (RotateSecret): HMAC-SHA256 of the org id under the operator's
// QUOTA_WEBHOOK_SECRET, hex. The API shows it to the org's admins.
func SigningSecret(master []byte, org string) string {
	m := hmac.New(sha256.New, master)
	m.Write([]byte(org))
	return hex.EncodeToString(m.Sum(nil))
}

// publicAddr reports whether ip may receive webhooks.
func publicAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	switch {
	case !ip.IsValid(), ip.IsLoopback(), ip.IsPrivate(), ip.IsLinkLocalUnicast(), ip.IsLinkLocalMulticast(),
		ip.IsUnspecified(), ip.IsMulticast(), ip.IsInterfaceLocalMulticast():
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return false
		}
	}
	return true
}

var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("100.64.0.0/10"), // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("64:ff9b::/96"), // NAT64 can reach private IPv4
	// more IPv6 ways to an IPv4 (or internal) address
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64 (RFC 8215)
	netip.MustParsePrefix("2002::/16"),      // 6to4: embeds any IPv4, private included
	netip.MustParsePrefix("2001::/32"),      // Teredo: embeds an IPv4 server and client
}

// URLWarning says why the worker would refuse a webhook URL by default, or returns ""
// when it would try it. It applies the worker's address check to what the URL
// itself names: an IP literal outside the public ranges, or localhost. A host name
// is resolved only when the worker connects (and checked then), so a name that
// resolves to a private address gets no warning here but a refusal in the delivery
// log.
func URLWarning(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "not an http(s) URL with a host: the worker cannot deliver to it"
	}
	const allow = ": the worker delivers to it only with QUOTA_WEBHOOK_ALLOW_PRIVATE=true " +
		"(local development, as make run sets it); a production server refuses it"
	host := strings.ToLower(u.Hostname())
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return host + " names this machine (loopback)" + allow
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return ""
	}
	ip = ip.WithZone("")
	if publicAddr(ip) {
		return ""
	}
	kind := "a non-public address"
	switch a := ip.Unmap(); {
	case a.IsLoopback():
		kind = "a loopback address"
	case a.IsPrivate():
		kind = "a private address"
	case a.IsLinkLocalUnicast():
		kind = "a link-local address"
	case a.IsUnspecified():
		kind = "the unspecified address"
	}
	return ip.String() + " is " + kind + allow
}

// NewClient returns the HTTP client webhooks are sent with: it checks the
// address every connection actually dials, after DNS resolution (so a name that
// resolves to 127.0.0.1 is refused too), follows no redirects and ignores proxy
// settings. allowPrivate lifts the address check (QUOTA_WEBHOOK_ALLOW_PRIVATE, tests).
func NewClient(timeout time.Duration, allowPrivate bool) *http.Client {
	dialer := &net.Dialer{Timeout: timeout, Control: func(network, address string, _ syscall.RawConn) error {
		if allowPrivate {
			return nil
		}
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !publicAddr(ap.Addr()) {
			return fmt.Errorf("%w: %s", ErrPrivateTarget, address)
		}
		return nil
	}}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{Proxy: nil, DialContext: dialer.DialContext, MaxIdleConnsPerHost: 4,
			IdleConnTimeout: 30 * time.Second, TLSHandshakeTimeout: timeout, ResponseHeaderTimeout: timeout},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// Deliverer delivers recorded events to their org's webhook, signed, and logs every
// attempt in webhook_deliveries. internal/worker runs it as a River job with retries.
type Deliverer struct {
	Store   *Store
	Tenants *tenants.Service
	// Secret is QUOTA_WEBHOOK_SECRET, from which the signing secret of an org without
	// its own (never rotated) is derived.
	Secret  []byte
	Client  *http.Client
	Metrics *Metrics
	// Clock picks the secrets valid now (default time.Now); the signature's timestamp
	// is always the real time of sending.
	Clock func() time.Time
}

// Envelope is a recorded event of an org, as the JSON body of its webhook.
type Envelope struct {
	ID        int64           `json:"id"`
	Type      string          `json:"type"`
	Org       string          `json:"org"`
	Period    string          `json:"period"`
	CreatedAt time.Time       `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

// Deliver sends event eventID, as the attempt-th attempt, to its org's webhook. An org
// without a webhook (removed meanwhile) is done.
//
// Errors: one wrapping ErrUndeliverable when retrying cannot help (an unknown event or
// org, a refused target, a URL that is not http(s)); any other failure, including a
// non-2xx answer or a redirect, may succeed on a retry.
func (w *Deliverer) Deliver(ctx context.Context, eventID int64, attempt int) error {
	ev, err := w.Store.envelope(ctx, eventID)
	if errors.Is(err, ErrNotFound) {
		return undeliverable{err}
	}
	if err != nil {
		return err
	}
	org, err := w.Tenants.GetOrg(ctx, ev.Org)
	if errors.Is(err, tenants.ErrNotFound) {
		return undeliverable{err}
	}
	if err != nil {
		return err
	}
	if org.WebhookURL == "" {
		return nil // the org removed its webhook meanwhile
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	now := time.Now
	if w.Clock != nil {
		now = w.Clock
	}
	secrets, err := w.Store.signingSecrets(ctx, w.Secret, ev.Org, now())
	if err != nil {
		return err
	}
	start := time.Now()
	status, sendErr := deliver(ctx, w.Client, secrets, org.WebhookURL, ev, body)
	d := time.Since(start)
	ok := sendErr == nil && status >= 200 && status < 300
	errText := ""
	if sendErr != nil {
		errText = DescribeSendError(sendErr, w.Client)
	} else if !ok {
		errText = "receiver answered " + strconv.Itoa(status)
	}
	if err := w.Store.logDelivery(context.WithoutCancel(ctx), ev, redactURL(org.WebhookURL), attempt, status, errText, ok, d); err != nil {
		return err
	}
	if ok {
		if w.Metrics != nil {
			w.Metrics.sent.Inc()
		}
		return nil
	}
	if w.Metrics != nil {
		w.Metrics.failed.Inc()
	}
	if errors.Is(sendErr, ErrPrivateTarget) || errors.Is(sendErr, errBadURL) {
		return undeliverable{sendErr}
	}
	return fmt.Errorf("deliver event %d to %s: %s", ev.ID, redactURL(org.WebhookURL), errText)
}

// DescribeSendError says in the API's words why a webhook could not be sent (nothing
// was answered): for the delivery log and a test send, which an org reads. Go's own
// error texts name the worker's side of the connection (its resolver's address, its
// local port: "dial tcp: lookup x on 10.0.0.2:53"), which is no business of the org
// and helps it no more than these do. client is the client that sent (for its
// timeout); nil: the default 10 s.
func DescribeSendError(err error, client *http.Client) string {
	timeout := 10 * time.Second
	if client != nil && client.Timeout > 0 {
		timeout = client.Timeout
	}
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalidCert x509.CertificateInvalidError
	var recordErr tls.RecordHeaderError
	var alert tls.AlertError
	var opErr *net.OpError
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrPrivateTarget):
		// Not the address the host resolved to: what a name resolves to inside the
		// worker's network is no business of the org's.
		return ErrPrivateTarget.Error() + ": webhooks are sent only to public addresses, not to loopback, private, link-local or other internal ones"
	case errors.Is(err, errBadURL):
		return "not an http(s) URL with a host: nothing can be delivered to it"
	case errors.As(err, &dnsErr):
		if dnsErr.IsNotFound {
			return "DNS lookup failed for " + dnsErr.Name + " (no such host)"
		}
		if dnsErr.IsTimeout {
			return "DNS lookup failed for " + dnsErr.Name + " (timed out)"
		}
		return "DNS lookup failed for " + dnsErr.Name
	case errors.As(err, &unknownAuth), errors.As(err, &certErr) && errors.As(certErr.Err, &unknownAuth):
		return "TLS handshake failed (the endpoint's certificate is not signed by a trusted authority)"
	case errors.As(err, &hostErr):
		return "TLS handshake failed (the endpoint's certificate is not valid for its host name)"
	case errors.As(err, &invalidCert):
		return "TLS handshake failed (the endpoint's certificate is invalid or expired)"
	case errors.As(err, &certErr), errors.As(err, &alert):
		return "TLS handshake failed"
	case errors.As(err, &recordErr):
		return "TLS handshake failed (the endpoint does not speak TLS on that port)"
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return "timed out after " + strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64) + " s"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "could not connect to the endpoint (connection refused)"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "could not connect to the endpoint (no route to the host)"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the endpoint closed the connection before answering"
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return "could not connect to the endpoint"
	case strings.Contains(err.Error(), "HTTP response to HTTPS client"):
		return "TLS handshake failed (the endpoint answered plain HTTP to https)"
	case strings.Contains(err.Error(), "tls:"):
		return "TLS handshake failed"
	}
	return "the request failed before the endpoint answered"
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// undeliverable is an error that also matches ErrUndeliverable; its message is its
// cause's.
type undeliverable struct{ err error }

func (u undeliverable) Error() string   { return u.err.Error() }
func (u undeliverable) Unwrap() []error { return []error{u.err, ErrUndeliverable} }

var errBadURL = errors.New("webhook url is not http(s)")

// deliver POSTs one event, signed with each of secrets (signingSecrets), to target
// with client (a default public-only client when nil) and returns the receiver's
// status; the worker and test sends share it.
func deliver(ctx context.Context, client *http.Client, secrets []string, target string, ev Envelope, body []byte) (int, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return 0, errBadURL
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return 0, errBadURL
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "Quotaplane-Webhook/1")
	req.Header.Set(EventHeader, ev.Type)
	req.Header.Set(DeliveryHeader, strconv.FormatInt(ev.ID, 10))
	req.Header.Set(SignatureHeader, webhook.SignAll(secrets, time.Now(), body))
	if client == nil {
		client = NewClient(10*time.Second, false)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}

// redactURL drops credentials and the query (which may carry tokens) from a URL for
// the delivery log.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(invalid url)"
	}
	u.User, u.RawQuery, u.Fragment = nil, "", ""
	return u.String()
}
