package billing

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/quotaplane/quotaplane/client/webhook"
	"github.com/quotaplane/quotaplane/internal/derrors"
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

// ErrPrivateTarget refuses a webhook whose host resolves to a loopback, private,
// link-local or otherwise non-public address.
var ErrPrivateTarget = errors.New("webhook target is not a public address")

// WebhookArgs is the River job that delivers one event to its org's webhook.
type WebhookArgs struct {
	EventID int64 `json:"event_id"`
}

// Kind names the job in River's tables.
func (WebhookArgs) Kind() string { return "billing.webhook" }

// InsertOpts gives a failing receiver 20 attempts: several hours with the default backoff.
func (WebhookArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 20} }

// SigningSecret is the key an org's webhooks are signed with: HMAC-SHA256 of the org
// id under the operator's QUOTA_WEBHOOK_SECRET, hex. The operator hands it to the org.
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

// NewWebhookClient returns the HTTP client webhooks are sent with: it checks the
// address every connection actually dials, after DNS resolution (so a name that
// resolves to 127.0.0.1 is refused too), follows no redirects and ignores proxy
// settings. allowPrivate lifts the address check (QUOTA_WEBHOOK_ALLOW_PRIVATE, tests).
func NewWebhookClient(timeout time.Duration, allowPrivate bool) *http.Client {
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

// WebhookWorker delivers events. Every attempt is logged in webhook_deliveries.
type WebhookWorker struct {
	river.WorkerDefaults[WebhookArgs]
	Store   *Store
	Tenants *tenants.Service
	// Secret is QUOTA_WEBHOOK_SECRET, from which each org's signing secret is derived.
	Secret []byte
	Client *http.Client
	// Backoff is the wait before retry attempt n (default: 2^n seconds with jitter,
	// capped at an hour).
	Backoff func(attempt int) time.Duration
	Metrics *Metrics
}

// NextRetry applies Backoff.
func (w *WebhookWorker) NextRetry(job *river.Job[WebhookArgs]) time.Time {
	if w.Backoff != nil {
		return time.Now().Add(w.Backoff(job.Attempt))
	}
	d := time.Duration(1<<min(job.Attempt, 12)) * time.Second
	d = min(d, time.Hour)
	return time.Now().Add(d/2 + rand.N(d/2+1))
}

// Timeout bounds one attempt.
func (w *WebhookWorker) Timeout(*river.Job[WebhookArgs]) time.Duration { return time.Minute }

// Envelope is the JSON body of a webhook.
type Envelope struct {
	ID        int64           `json:"id"`
	Type      string          `json:"type"`
	Org       string          `json:"org"`
	Period    string          `json:"period"`
	CreatedAt time.Time       `json:"created_at"`
	Data      json.RawMessage `json:"data"`
}

// Work sends the event. A refused target cancels the job (retrying cannot help); any
// other failure, including a non-2xx answer or a redirect, is retried with backoff.
func (w *WebhookWorker) Work(ctx context.Context, job *river.Job[WebhookArgs]) error {
	var ev Envelope
	err := w.Store.pool.QueryRow(ctx, `SELECT id, type, org_id, period, created_at, payload FROM billing_events WHERE id = $1`,
		job.Args.EventID).Scan(&ev.ID, &ev.Type, &ev.Org, &ev.Period, &ev.CreatedAt, &ev.Data)
	if errors.Is(err, pgx.ErrNoRows) {
		return river.JobCancel(fmt.Errorf("event %d: %w", job.Args.EventID, ErrNotFound))
	}
	if err != nil {
		return err
	}
	org, err := w.Tenants.GetOrg(ctx, ev.Org)
	if errors.Is(err, tenants.ErrNotFound) {
		return river.JobCancel(err)
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
	start := time.Now()
	status, sendErr := w.send(ctx, org.WebhookURL, ev, body)
	d := time.Since(start)
	ok := sendErr == nil && status >= 200 && status < 300
	errText := ""
	if sendErr != nil {
		errText = sendErr.Error()
	} else if !ok {
		errText = "receiver answered " + strconv.Itoa(status)
	}
	if _, err := w.Store.pool.Exec(context.WithoutCancel(ctx), `INSERT INTO webhook_deliveries
		(event_id, org_id, url, attempt, status_code, error, succeeded, duration_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		ev.ID, ev.Org, redactURL(org.WebhookURL), job.Attempt, status, errText, ok, d.Milliseconds()); err != nil {
		return err
	}
	if ok {
		if w.Metrics != nil {
			w.Metrics.webhookSent.Inc()
		}
		return nil
	}
	if w.Metrics != nil {
		w.Metrics.webhookFailed.Inc()
	}
	if errors.Is(sendErr, ErrPrivateTarget) || errors.Is(sendErr, errBadURL) {
		return river.JobCancel(sendErr)
	}
	return fmt.Errorf("deliver event %d to %s: %s", ev.ID, redactURL(org.WebhookURL), errText)
}

var errBadURL = errors.New("webhook url is not http(s)")

func (w *WebhookWorker) send(ctx context.Context, target string, ev Envelope, body []byte) (int, error) {
	return deliver(ctx, w.Client, w.Secret, target, ev, body)
}

// deliver POSTs one signed event to target with client (a default public-only client
// when nil) and returns the receiver's status; the worker and test sends share it.
func deliver(ctx context.Context, client *http.Client, master []byte, target string, ev Envelope, body []byte) (int, error) {
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
	req.Header.Set(SignatureHeader, webhook.Sign(SigningSecret(master, ev.Org), time.Now(), body))
	if client == nil {
		client = NewWebhookClient(10*time.Second, false)
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

// Delivery is one logged webhook attempt.
type Delivery struct {
	ID          int64
	EventID     int64
	EventType   string
	URL         string // without credentials or query
	Attempt     int
	StatusCode  int    // 0: no HTTP answer
	Error       string // "" for a success
	Succeeded   bool
	AttemptedAt time.Time
}

// Deliveries returns one page of an org's webhook attempts, newest first, and the
// cursor of the next page ("" on the last). The cursor is the last id of the page.
//
// Errors: a *tenants.ValidationError for a cursor this API did not return.
func (s *Store) Deliveries(ctx context.Context, org string, page tenants.Page) ([]Delivery, string, error) {
	before := int64(math.MaxInt64)
	if page.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(page.Cursor)
		if err == nil {
			before, err = strconv.ParseInt(string(b), 10, 64)
		}
		if err != nil {
			return nil, "", &tenants.ValidationError{Fields: []tenants.FieldError{{Field: "cursor", Message: "is not a cursor this API returned"}}}
		}
	}
	n := page.Limit
	if n <= 0 {
		n = 100
	}
	n = min(n, 1000)
	rows, err := s.pool.Query(ctx, `SELECT d.id, d.event_id, e.type, d.url, d.attempt, d.status_code, d.error, d.succeeded, d.attempted_at
		FROM webhook_deliveries d JOIN billing_events e ON e.id = d.event_id
		WHERE d.org_id = $1 AND d.id < $2 ORDER BY d.id DESC LIMIT $3`, org, before, n+1)
	if err != nil {
		return nil, "", fmt.Errorf("list webhook deliveries of %s: %w", org, err)
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		err := r.Scan(&d.ID, &d.EventID, &d.EventType, &d.URL, &d.Attempt, &d.StatusCode, &d.Error, &d.Succeeded, &d.AttemptedAt)
		return d, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("list webhook deliveries of %s: %w", org, err)
	}
	if len(ds) <= n {
		return ds, "", nil
	}
	ds = ds[:n]
	return ds, base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(ds[n-1].ID, 10))), nil
}

// WebhookEvents are the event types an org's webhook receives.
var WebhookEvents = []string{EventThreshold, EventPeriodClosed}

// WebhookInfo is what an org needs to receive its webhooks.
type WebhookInfo struct {
	URL string // "" for none
	// SigningSecret is the org's HMAC key; "" when the server has no QUOTA_WEBHOOK_SECRET.
	SigningSecret   string
	SignatureHeader string
	Events          []string
	// URLWarning says why the worker would refuse URL by default (URLWarning); "" when
	// it would try it.
	URLWarning string
}

// Webhook returns org's webhook URL and signing secret, derived from WebhookSecret as
// the worker derives it.
//
// Errors: tenants.ErrNotFound for an unknown org.
func (s *Service) Webhook(ctx context.Context, org string) (WebhookInfo, error) {
	o, err := s.Tenants.GetOrg(ctx, org)
	if err != nil {
		return WebhookInfo{}, err
	}
	info := WebhookInfo{URL: o.WebhookURL, SignatureHeader: SignatureHeader, Events: append([]string{}, WebhookEvents...),
		URLWarning: URLWarning(o.WebhookURL)}
	if len(s.WebhookSecret) > 0 {
		info.SigningSecret = SigningSecret(s.WebhookSecret, org)
	}
	return info, nil
}

// Deliveries returns one page of org's webhook attempts, newest first.
//
// Errors: tenants.ErrNotFound for an unknown org; a *tenants.ValidationError for a bad
// cursor.
func (s *Service) Deliveries(ctx context.Context, org string, page tenants.Page) ([]Delivery, string, error) {
	if _, err := s.Tenants.GetOrg(ctx, org); err != nil {
		return nil, "", err
	}
	return s.Store.Deliveries(ctx, org, page)
}

// EventTest is the type of the event TestWebhook sends.
const EventTest = "webhook.test"

// TestDelivery is the result of one test event sent to an org's webhook.
type TestDelivery struct {
	URL        string // without credentials or query
	StatusCode int    // 0: no HTTP answer
	Error      string // "" for a success
	Succeeded  bool
	Duration   time.Duration
	At         time.Time
	// URLWarning says why the target was refused as a non-public address; "" otherwise.
	URLWarning string
}

// Errors of TestWebhook that are the org's or the server's settings, not the receiver.
var (
	ErrNoWebhookURL  = derrors.New(derrors.Unprocessable, "the org has no webhook URL: set webhook_url first")
	ErrNoSigningKey  = derrors.New(derrors.Unprocessable, "QUOTA_WEBHOOK_SECRET is not set on this server, so there is no key to sign a webhook with")
	testDeliveryWait = 10 * time.Second
)

// TestWebhook sends one webhook.test event to org's webhook URL now, signed as the
// worker signs, through WebhookClient (the public-only client when nil), and returns
// what happened. A receiver that fails or a refused target is a result, not an error.
// The event is not recorded or retried; its id is 0.
//
// Errors: tenants.ErrNotFound for an unknown org; ErrNoWebhookURL; ErrNoSigningKey.
func (s *Service) TestWebhook(ctx context.Context, org string) (TestDelivery, error) {
	o, err := s.Tenants.GetOrg(ctx, org)
	if err != nil {
		return TestDelivery{}, err
	}
	if o.WebhookURL == "" {
		return TestDelivery{}, ErrNoWebhookURL
	}
	if len(s.WebhookSecret) == 0 {
		return TestDelivery{}, ErrNoSigningKey
	}
	now := time.Now
	if s.Clock != nil {
		now = s.Clock
	}
	at := now().UTC()
	data, _ := json.Marshal(map[string]string{"message": "a test event sent from Quotaplane; no action is needed"})
	ev := Envelope{ID: 0, Type: EventTest, Org: org, Period: "", CreatedAt: at, Data: data}
	body, err := json.Marshal(ev)
	if err != nil {
		return TestDelivery{}, err
	}
	sendCtx, cancel := context.WithTimeout(ctx, testDeliveryWait)
	defer cancel()
	start := time.Now()
	status, sendErr := deliver(sendCtx, s.WebhookClient, s.WebhookSecret, o.WebhookURL, ev, body)
	out := TestDelivery{URL: redactURL(o.WebhookURL), StatusCode: status, Duration: time.Since(start), At: at}
	out.Succeeded = sendErr == nil && status >= 200 && status < 300
	switch {
	case errors.Is(sendErr, ErrPrivateTarget):
		out.Error = sendErr.Error()
		out.URLWarning = privateWarning(o.WebhookURL, sendErr)
	case errors.Is(sendErr, errBadURL):
		out.Error = "not an http(s) URL with a host: nothing can be delivered to it"
	case sendErr != nil:
		if ctx.Err() != nil {
			return TestDelivery{}, ctx.Err()
		}
		out.Error = sendErr.Error()
	case !out.Succeeded:
		out.Error = "receiver answered " + strconv.Itoa(status)
	}
	return out, nil
}

// privateWarning explains a refused target: URLWarning's words for an address the URL
// names itself, or the dialled address for a host name that resolved to one.
func privateWarning(target string, err error) string {
	if w := URLWarning(target); w != "" {
		return w
	}
	return "the host resolves to a non-public address (" + strings.TrimPrefix(err.Error(), ErrPrivateTarget.Error()+": ") +
		"): the api and the worker deliver to it only with QUOTA_WEBHOOK_ALLOW_PRIVATE=true (local development); a production server refuses it"
}
