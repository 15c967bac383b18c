package billing

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// Event types sent to an org's webhook.
const (
	EventThreshold    = "usage.threshold"
	EventPeriodClosed = "period.closed"
)

// Thresholds are the percentages of a level's monthly limit that raise a
// usage.threshold event, once per period each.
var Thresholds = []int64{80, 100}

// Enqueuer inserts River jobs inside a transaction; *river.Client[pgx.Tx] is one.
type Enqueuer interface {
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// Event is a recorded event of an org.
type Event struct {
	ID        int64           `json:"id"`
	Org       string          `json:"org"`
	Type      string          `json:"type"`
	Period    string          `json:"period"`
	Data      json.RawMessage `json:"data"`
	CreatedAt time.Time       `json:"created_at"`
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

// recordEvent stores an event once per (org, dedupKey) and, when it is new and the
// org has a webhook, enqueues its delivery in the same transaction. It returns the
// event id, 0 when the event already existed.
func recordEvent(ctx context.Context, tx pgx.Tx, q Enqueuer, org, typ, period, dedupKey string, data any, webhook bool) (int64, error) {
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
	if webhook && q != nil {
		if _, err := q.InsertTx(ctx, tx, WebhookArgs{EventID: id}, nil); err != nil {
			return 0, fmt.Errorf("enqueue webhook of event %d: %w", id, err)
		}
	}
	return id, nil
}

// Events lists an org's events, newest first, at most limit.
func (s *Store) Events(ctx context.Context, org string, limit int) ([]Event, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, org_id, type, period, payload, created_at FROM billing_events
		WHERE org_id = $1 ORDER BY id DESC LIMIT $2`, org, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.ID, &e.Org, &e.Type, &e.Period, &e.Data, &e.CreatedAt)
		return e, err
	})
}

// thresholdNotifier raises usage.threshold events for counters that crossed 80 % or
// 100 % of their month limit. It remembers what it has recorded, so a counter over
// a threshold costs one map lookup per flush, not a Postgres round trip.
type thresholdNotifier struct {
	store  *Store
	limits *limitCache
	queue  func() Enqueuer

	// seen remembers the events recorded, bounded: forgetting one only costs a
	// no-op insert (the table dedupes) the next time its counter is flushed.
	seen  *lru.Cache[string, struct{}]
	mSeen cachemetrics.Hooks
	util  *utilization
}

// check also records each counter's share of its month limit for
// quotaplane_worker_month_utilization_ratio; end is the period's end.
func (n *thresholdNotifier) check(ctx context.Context, org, period string, end time.Time, counters map[quota.Counter]int64) error {
	if len(counters) == 0 {
		return nil
	}
	l, err := n.limits.get(ctx, org)
	if err != nil {
		return err
	}
	type hit struct {
		key  string
		data ThresholdData
	}
	var hits []hit
	for c, v := range counters {
		limit, ok := l.month(c)
		if !ok || limit <= 0 {
			continue
		}
		n.util.observe(org, period, end, string(c.Level), c.Metric, float64(v)/float64(limit))
		for _, pct := range Thresholds {
			if v*100 < pct*limit {
				break
			}
			key := strings.Join([]string{"threshold", period, string(c.Level), c.Team, c.User, c.Metric, fmt.Sprint(pct)}, "|")
			if n.seen.Contains(org + "|" + key) {
				n.mSeen.Hit()
				continue
			}
			n.mSeen.Miss()
			hits = append(hits, hit{key: key, data: ThresholdData{Level: string(c.Level), Team: c.Team, User: c.User,
				Metric: c.Metric, Threshold: pct, Limit: limit, Used: v}})
		}
	}
	if len(hits) == 0 {
		return nil
	}
	var q Enqueuer
	if n.queue != nil {
		q = n.queue()
	}
	// Whether to send is decided on the org as it is now, not as the limit cache saw it
	// up to its TTL ago: an org that set its webhook just before crossing a threshold
	// would have the event recorded and never sent. Events are rare; one read each.
	o, err := n.limits.svc.GetOrg(ctx, org)
	if err != nil {
		return err
	}
	err = n.store.inTx(ctx, func(tx pgx.Tx) error {
		for _, h := range hits {
			if _, err := recordEvent(ctx, tx, q, org, EventThreshold, period, h.key, h.data, o.WebhookURL != ""); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, h := range hits {
		if n.seen.Add(org+"|"+h.key, struct{}{}) {
			n.mSeen.Evict()
		}
	}
	return nil
}
