// Package webhooks notifies orgs of their events: it records events once per org and
// key (RecordEvent, in the caller's transaction, with the delivery queued in the same
// one), delivers them HMAC-signed to the org's webhook (Deliverer, run by a River job
// of internal/worker), keeps the delivery log, and answers the webhook API (Service:
// the URL and signing secret, the log, a test event).
//
// The events themselves are raised elsewhere: usage.threshold by the ledger's flusher,
// period.closed by billing's close. The package does not import River: the worker
// implements Enqueuer and runs Deliverer.
package webhooks

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Errors of the package; wrapped with context, test them with errors.Is.
var (
	// ErrNotFound marks an event that does not exist.
	ErrNotFound = derrors.New(derrors.NotFound, "not found")
	// ErrPrivateTarget refuses a webhook whose host resolves to a loopback, private,
	// link-local or otherwise non-public address.
	ErrPrivateTarget = errors.New("webhook target is not a public address")
	// ErrUndeliverable marks a delivery that no retry can make succeed (an unknown
	// event or org, a refused or malformed target): its job is cancelled.
	ErrUndeliverable = errors.New("webhook cannot be delivered")
	// ErrNoWebhookURL and ErrNoSigningKey are errors of TestWebhook that are the
	// org's or the server's settings, not the receiver.
	ErrNoWebhookURL = derrors.New(derrors.Unprocessable, "the org has no webhook URL: set webhook_url first")
	ErrNoSigningKey = derrors.New(derrors.Unprocessable, "QUOTA_WEBHOOK_SECRET is not set on this server, so there is no key to sign a webhook with")
)

// Event types sent to an org's webhook.
const (
	EventThreshold    = "usage.threshold"
	EventPeriodClosed = "period.closed"
)

// Enqueuer queues the delivery of a recorded event inside the transaction that
// recorded it; internal/worker implements it with River.
type Enqueuer interface {
	EnqueueDelivery(ctx context.Context, tx pgx.Tx, eventID int64) error
}

// ThresholdData is the data of a usage.threshold event.
type ThresholdData struct {
	Level     string `json:"level"`
	Team      string `json:"team,omitempty"`
	User      string `json:"user,omitempty"`
	Metric    string `json:"metric"`
	Threshold int64  `json:"threshold"` // percent
	Limit     int64  `json:"limit"`
	Used      int64  `json:"used"`
}

// RecordEvent stores an event in tx once per (org, dedupKey) and, when it is new and
// send is set (the org has a webhook), enqueues its delivery with q (nil: none) in the
// same transaction. It returns the event id, 0 when the event already existed.
func RecordEvent(ctx context.Context, tx pgx.Tx, q Enqueuer, org, typ, period, dedupKey string, data any, send bool) (int64, error) {
	body, err := json.Marshal(data)
	if err != nil {
		return 0, err
	}
	var id int64
	err = tx.QueryRow(ctx, `INSERT INTO billing_events (org_id, type, period, dedup_key, payload)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (org_id, dedup_key) DO NOTHING RETURNING id`,
		org, typ, period, dedupKey, body).Scan(&id)
	if err == pgx.ErrNoRows {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("record %s event of %s: %w", typ, org, err)
	}
	if send && q != nil {
		if err := q.EnqueueDelivery(ctx, tx, id); err != nil {
			return 0, fmt.Errorf("enqueue webhook of event %d: %w", id, err)
		}
	}
	return id, nil
}

// Store is the record of events and the webhook delivery log in Postgres.
type Store struct {
	pool pgdb.DB // its errors match derrors.Unavailable when Postgres is down
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pgdb.DB{Pool: pool}} }

// Events lists an org's events, newest first, at most limit, each as its webhook's
// body.
func (s *Store) Events(ctx context.Context, org string, limit int) ([]Envelope, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, org_id, type, period, payload, created_at FROM billing_events
		WHERE org_id = $1 ORDER BY id DESC LIMIT $2`, org, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Envelope, error) {
		var e Envelope
		err := r.Scan(&e.ID, &e.Org, &e.Type, &e.Period, &e.Data, &e.CreatedAt)
		return e, err
	})
}

// envelope reads event id as the body of its webhook; ErrNotFound when there is none.
func (s *Store) envelope(ctx context.Context, id int64) (Envelope, error) {
	var ev Envelope
	err := s.pool.QueryRow(ctx, `SELECT id, type, org_id, period, created_at, payload FROM billing_events WHERE id = $1`,
		id).Scan(&ev.ID, &ev.Type, &ev.Org, &ev.Period, &ev.CreatedAt, &ev.Data)
	if errors.Is(err, pgx.ErrNoRows) {
		return ev, fmt.Errorf("event %d: %w", id, ErrNotFound)
	}
	return ev, err
}

// logDelivery writes one attempt to the delivery log.
func (s *Store) logDelivery(ctx context.Context, ev Envelope, url string, attempt, status int, errText string, ok bool, d time.Duration) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO webhook_deliveries
		(event_id, org_id, url, attempt, status_code, error, succeeded, duration_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		ev.ID, ev.Org, url, attempt, status, errText, ok, d.Milliseconds())
	return err
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
