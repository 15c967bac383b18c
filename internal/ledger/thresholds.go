package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// Thresholds are the percentages of a level's monthly limit that raise a
// usage.threshold event, once per period each.
var Thresholds = []int64{80, 100}

// thresholdNotifier raises usage.threshold events for counters that crossed 80 % or
// 100 % of their month limit. It remembers what it has recorded, so a counter over
// a threshold costs one map lookup per flush, not a Postgres round trip.
type thresholdNotifier struct {
	store  *Store
	limits *limitCache
	queue  func() webhooks.Enqueuer

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
		data webhooks.ThresholdData
	}
	var hits []hit
	for c, v := range counters {
		limit, ok := l.Month(c)
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
			hits = append(hits, hit{key: key, data: webhooks.ThresholdData{Level: string(c.Level), Team: c.Team, User: c.User,
				Metric: c.Metric, Threshold: pct, Limit: limit, Used: v}})
		}
	}
	if len(hits) == 0 {
		return nil
	}
	var q webhooks.Enqueuer
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
	err = n.store.InTx(ctx, func(tx pgx.Tx) error {
		for _, h := range hits {
			if _, err := webhooks.RecordEvent(ctx, tx, q, org, webhooks.EventThreshold, period, h.key, h.data, o.WebhookURL != ""); err != nil {
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
