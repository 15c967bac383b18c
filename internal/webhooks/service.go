package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Service answers the webhook API of an org: its URL and signing secret, its
// delivery log, and a test event sent now.
type Service struct {
	Store   *Store
	Tenants *tenants.Service
	// Secret is QUOTA_WEBHOOK_SECRET, from which each org's signing secret is
	// derived (SigningSecret); empty: the server knows no signing secret.
	Secret []byte
	// Client sends test events (TestWebhook); nil: NewClient with the address check on.
	Client *http.Client
	// Clock dates test events and rotations, and picks the secrets that sign (default
	// time.Now).
	Clock func() time.Time
	// Grace is how long a rotated-out secret still signs (0: SecretGrace).
	Grace time.Duration
}

// WebhookEvents are the event types an org's webhook receives.
var WebhookEvents = []string{EventThreshold, EventPeriodClosed}

// WebhookInfo is what an org needs to receive its webhooks.
type WebhookInfo struct {
	URL string // "" for none
	// SigningSecret is the org's current HMAC key: its own after a rotation, else the
	// derived one; "" when the server has no QUOTA_WEBHOOK_SECRET.
	SigningSecret   string
	SignatureHeader string
	Events          []string
	// URLWarning says why the worker would refuse URL by default (URLWarning); "" when
	// it would try it.
	URLWarning string
}

// Webhook returns org's webhook URL and current signing secret, the one the worker
// signs with first: the org's own after a rotation, else derived from Secret.
//
// Errors: tenants.ErrNotFound for an unknown org.
func (s *Service) Webhook(ctx context.Context, org string) (WebhookInfo, error) {
	o, err := s.Tenants.GetOrg(ctx, org)
	if err != nil {
		return WebhookInfo{}, err
	}
	info := WebhookInfo{URL: o.WebhookURL, SignatureHeader: SignatureHeader, Events: append([]string{}, WebhookEvents...),
		URLWarning: URLWarning(o.WebhookURL)}
	if len(s.Secret) > 0 {
		secrets, err := s.Store.signingSecrets(ctx, s.Secret, org, s.now())
		if err != nil {
			return WebhookInfo{}, err
		}
		info.SigningSecret = secrets[0]
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

// testDeliveryWait bounds TestWebhook's one attempt.
var testDeliveryWait = 10 * time.Second

// TestWebhook sends one webhook.test event to org's webhook URL now, signed as the
// worker signs, through Client (the public-only client when nil), and returns
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
	if len(s.Secret) == 0 {
		return TestDelivery{}, ErrNoSigningKey
	}
	at := s.now().UTC()
	data, _ := json.Marshal(map[string]string{"message": "a test event sent from Quotaplane; no action is needed"})
	ev := Envelope{ID: 0, Type: EventTest, Org: org, Period: "", CreatedAt: at, Data: data}
	body, err := json.Marshal(ev)
	if err != nil {
		return TestDelivery{}, err
	}
	sendCtx, cancel := context.WithTimeout(ctx, testDeliveryWait)
	defer cancel()
	secrets, err := s.Store.signingSecrets(ctx, s.Secret, org, s.now())
	if err != nil {
		return TestDelivery{}, err
	}
	start := time.Now()
	status, sendErr := deliver(sendCtx, s.Client, secrets, o.WebhookURL, ev, body)
	out := TestDelivery{URL: redactURL(o.WebhookURL), StatusCode: status, Duration: time.Since(start), At: at}
	out.Succeeded = sendErr == nil && status >= 200 && status < 300
	switch {
	case errors.Is(sendErr, ErrPrivateTarget):
		out.Error = DescribeSendError(sendErr, s.Client)
		out.URLWarning = privateWarning(o.WebhookURL)
	case sendErr != nil:
		if ctx.Err() != nil {
			return TestDelivery{}, ctx.Err()
		}
		client := s.Client
		if client == nil {
			client = &http.Client{Timeout: testDeliveryWait}
		}
		out.Error = DescribeSendError(sendErr, client)
	case !out.Succeeded:
		out.Error = "receiver answered " + strconv.Itoa(status)
	}
	return out, nil
}

// privateWarning explains a refused target: URLWarning's words for an address the URL
// names itself, or the dialled address for a host name that resolved to one.
func privateWarning(target string) string {
	if w := URLWarning(target); w != "" {
		return w
	}
	return "the host resolves to a non-public address: the api and the worker deliver to it only with QUOTA_WEBHOOK_ALLOW_PRIVATE=true (local development); a production server refuses it"
}
