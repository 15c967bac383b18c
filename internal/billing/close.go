package billing

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// CloserConfig configures a Closer. Store, Tenants and Counters are required.
type CloserConfig struct {
	Store    *Store
	Tenants  *tenants.Service
	Counters ledger.CounterSource
	// Queue enqueues the webhook delivery of period.closed; nil records the event only.
	Queue func() webhooks.Enqueuer
	// Clock decides which periods have ended (default time.Now); tests inject one.
	Clock func() time.Time
	// Grace is how long after a period's end it is closed (default 1 minute), so the
	// last checks of the period reach Redis first.
	Grace time.Duration
	// WorkerID is recorded as closed_by.
	WorkerID string
	Logger   *slog.Logger
	Metrics  *Metrics
}

// Closer finalizes billing periods: immutable per-entity usage, billing lines from the
// plan's pricing, and a period.closed event, all in one transaction, once.
type Closer struct {
	cfg CloserConfig
}

// NewCloser returns a Closer.
func NewCloser(cfg CloserConfig) *Closer {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Grace < 0 {
		cfg.Grace = 0
	} else if cfg.Grace == 0 {
		cfg.Grace = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	return &Closer{cfg: cfg}
}

// Due lists the periods that have ended and are not closed: for every org, its two
// latest ended periods (so a worker down for up to a month catches up), skipping
// periods that ended before the org existed. It sets
// quotaplane_worker_oldest_unclosed_period_end_timestamp_seconds to the end of the
// oldest of them (0 when there is none).
//
// One query, not one per org: the candidate periods depend only on the billing anchor
// day, so they are computed here for each of the 28 days, joined to the orgs of that
// day, and those already in billing_periods are dropped by its primary key. Steady
// state, it returns nothing and reads no billing row per org it skips but one index
// probe.
func (c *Closer) Due(ctx context.Context) ([]OrgPeriod, error) {
	now := c.cfg.Clock()
	var anchors []int32
	var ids []string
	var ends []time.Time
	for day := 1; day <= 28; day++ {
		per := vocab.PeriodAt(now.Add(-c.cfg.Grace), day)
		for range 2 {
			per = vocab.PeriodAt(per.Start.Add(-time.Nanosecond), day)
			anchors, ids, ends = append(anchors, int32(day)), append(ids, per.ID), append(ends, per.End)
		}
	}
	rows, err := c.cfg.Store.pool.Query(ctx, `SELECT o.id, x.p, x.e
		FROM unnest($1::int[], $2::text[], $3::timestamptz[]) AS x(a, p, e)
		JOIN orgs o ON o.billing_anchor_day = x.a
			AND x.e > o.created_at
		WHERE NOT EXISTS (SELECT 1 FROM billing_periods b WHERE b.org_id = o.id AND b.period = x.p)
		ORDER BY o.id, x.p`, anchors, ids, ends)
	if err != nil {
		return nil, fmt.Errorf("periods due: %w", err)
	}
	var oldest time.Time
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OrgPeriod, error) {
		var a OrgPeriod
		var end time.Time
		err := r.Scan(&a.Org, &a.Period, &end)
		if oldest.IsZero() || end.Before(oldest) {
			oldest = end
		}
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("periods due: %w", err)
	}
	if oldest.IsZero() {
		c.cfg.Metrics.oldestUnclosed.Set(0)
	} else {
		c.cfg.Metrics.oldestUnclosed.Set(float64(oldest.Unix()))
	}
	return due, nil
}

// CloseMany closes items, parallel at a time (at least 1), each as Close does
// (exactly once whoever else closes them), and returns the error of each item that
// failed, by its index. Batching spares a job per org.
func (c *Closer) CloseMany(ctx context.Context, items []OrgPeriod, parallel int) map[int]error {
	var mu sync.Mutex
	failed := map[int]error{}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(parallel, 1))
	for i, it := range items {
		g.Go(func() error {
			if _, err := c.Close(gctx, it.Org, it.Period); err != nil {
				mu.Lock()
				failed[i] = err
				mu.Unlock()
			}
			return nil
		})
	}
	_ = g.Wait()
	return failed
}

// OrgPeriod names one billing period of an org.
type OrgPeriod struct {
	Org    string
	Period string
}

// Line is the billing line of one metric of a closed period.
type Line struct {
	Metric        string `json:"metric"`
	Units         int64  `json:"units"`
	IncludedUnits int64  `json:"included_units"`
	OverageUnits  int64  `json:"overage_units"`
	Amount        string `json:"amount"`
	Currency      string `json:"currency"`
}

// CloseResult says what closing a period did.
type CloseResult struct {
	Org, Period   string
	AlreadyClosed bool   // nothing was changed
	Counters      int    // usage rows written
	Lines         []Line // billing lines written
}

// ClosedData is the data of a period.closed event.
type ClosedData struct {
	Period      string    `json:"period"`
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	Lines       []Line    `json:"lines"`
}

// reservationRowRetention is how long past its expiry a settled reservation's row is
// kept: as long as Redis keeps its record (quota's recordRetention) and hydration may
// restore it (StoredReservations).
const reservationRowRetention = 24 * time.Hour

// Close finalizes period of org, once: running it again, or on two workers at once,
// changes nothing (the second sees the closed period under the period lock and
// returns AlreadyClosed). The final usage of each counter is the larger of Redis's
// and the ledger's value. It also deletes the org's settled reservation rows of this
// period and earlier ones more than reservationRowRetention past their expiry.
//
// Errors: ErrNotDue before the period's end plus the grace; tenants.ErrNotFound for an
// unknown org; a Redis or Postgres error (retry later: nothing was written).
func (c *Closer) Close(ctx context.Context, org, period string) (CloseResult, error) {
	res := CloseResult{Org: org, Period: period}
	o, err := c.cfg.Tenants.GetOrg(ctx, org)
	if err != nil {
		return res, fmt.Errorf("close %s %s: %w", org, period, err)
	}
	per, err := PeriodOf(period, o.BillingAnchorDay)
	if err != nil {
		return res, err
	}
	if now := c.cfg.Clock(); now.Before(per.End.Add(c.cfg.Grace)) {
		return res, fmt.Errorf("close %s %s: %w (ends %s)", org, period, ErrNotDue, per.End.Format(time.RFC3339))
	}
	if closed, err := c.cfg.Store.closed(ctx, org, period); err != nil || closed {
		res.AlreadyClosed = closed
		return res, err
	}
	plan, err := c.cfg.Tenants.GetPlan(ctx, o.PlanID)
	if err != nil {
		return res, fmt.Errorf("close %s %s: %w", org, period, err)
	}
	cs, err := c.cfg.Counters.CountersFor(org, tenants.RouteOf(o, plan))
	if err != nil {
		return res, err
	}
	live, err := cs.MonthUsage(ctx, org, period)
	if err != nil {
		return res, fmt.Errorf("close %s %s: %w", org, period, err)
	}
	limits, err := ledger.LoadLimits(ctx, c.cfg.Tenants, org)
	if err != nil {
		return res, fmt.Errorf("close %s %s: %w", org, period, err)
	}
	var q webhooks.Enqueuer
	if c.cfg.Queue != nil {
		q = c.cfg.Queue()
	}
	err = c.cfg.Store.ledger.InTx(ctx, func(tx pgx.Tx) error {
		res.AlreadyClosed, res.Counters, res.Lines = false, 0, nil
		if err := ledger.PeriodLock(ctx, tx, org, period); err != nil {
			return err
		}
		var closed bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM billing_periods WHERE org_id = $1 AND period = $2)`,
			org, period).Scan(&closed); err != nil {
			return err
		}
		if closed {
			res.AlreadyClosed = true
			return nil
		}
		// The ledger takes Redis's values first (never lowering), so it is the final usage.
		if err := ledger.UpsertCounters(ctx, tx, org, period, live); err != nil {
			return err
		}
		// The final usage is the usage at the end of the period's last day.
		if err := ledger.RecordDaily(ctx, tx, org, period, per.End.Add(-time.Nanosecond), nil); err != nil {
			return err
		}
		currency := ""
		if plan.Pricing != nil {
			currency = plan.Pricing.Currency
		}
		if _, err := tx.Exec(ctx, `INSERT INTO billing_periods (org_id, period, period_start, period_end, plan_id, currency, closed_by)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, org, period, per.Start, per.End, plan.ID, currency, c.cfg.WorkerID); err != nil {
			return err
		}
		n, orgUnits, err := copyFinalUsage(ctx, tx, org, period, limits)
		if err != nil {
			return err
		}
		res.Counters = n
		if res.Lines, err = writeLines(ctx, tx, org, period, orgUnits, plan.Pricing); err != nil {
			return err
		}
		// Settled reservations of this period and earlier ones are read by nobody once a
		// day past their expiry (GET reads Redis, which keeps a settled record that long;
		// hydration restores held ones and the last day's): their rows go, held ones stay.
		if _, err := tx.Exec(ctx, `DELETE FROM reservations WHERE org_id = $1 AND period <= $2 AND state <> 'held'
			AND expires_at < $3`, org, period, c.cfg.Clock().Add(-reservationRowRetention)); err != nil {
			return err
		}
		_, err = webhooks.RecordEvent(ctx, tx, q, org, webhooks.EventPeriodClosed, period, "period.closed|"+period,
			ClosedData{Period: period, PeriodStart: per.Start, PeriodEnd: per.End, Lines: res.Lines}, o.WebhookURL != "")
		return err
	})
	if err != nil {
		return CloseResult{Org: org, Period: period}, fmt.Errorf("close %s %s: %w", org, period, err)
	}
	if !res.AlreadyClosed {
		c.cfg.Metrics.periodsClosed.Inc()
		attrs := []any{"org", org, "period", period, "usage_rows", res.Counters, "lines", len(res.Lines), "worker", c.cfg.WorkerID}
		for _, l := range res.Lines {
			attrs = append(attrs, "line_"+l.Metric, fmt.Sprintf("%d units, %d included, %d over, %s %s",
				l.Units, l.IncludedUnits, l.OverageUnits, l.Amount, l.Currency))
		}
		c.cfg.Logger.Info("closed billing period", attrs...)
	}
	return res, nil
}

// insertChunk bounds the rows of one insert statement.
const insertChunk = 5000

// copyFinalUsage writes the ledger's counters of the period as immutable rows, with
// each counter's month limit, and returns how many and the org-level units by metric.
func copyFinalUsage(ctx context.Context, tx pgx.Tx, org, period string, limits *ledger.Limits) (int, map[string]int64, error) {
	rows, err := tx.Query(ctx, `SELECT metric, level, team_id, user_id, units FROM usage_counters
		WHERE org_id = $1 AND period = $2 ORDER BY metric, level, team_id, user_id`, org, period)
	if err != nil {
		return 0, nil, err
	}
	var all []counterRow
	var r counterRow
	if _, err := pgx.ForEachRow(rows, []any{&r.metric, &r.level, &r.team, &r.user, &r.units}, func() error {
		all = append(all, r)
		return nil
	}); err != nil {
		return 0, nil, err
	}
	orgUnits := map[string]int64{}
	for i := 0; i < len(all); i += insertChunk {
		chunk := all[i:min(i+insertChunk, len(all))]
		metrics := make([]string, len(chunk))
		levels := make([]string, len(chunk))
		teams := make([]string, len(chunk))
		users := make([]string, len(chunk))
		units := make([]int64, len(chunk))
		lims := make([]*int64, len(chunk))
		for j, r := range chunk {
			metrics[j], levels[j], teams[j], users[j], units[j] = r.metric, r.level, r.team, r.user, r.units
			if l, ok := limits.Month(r.counter()); ok {
				lims[j] = &l
			}
			if r.level == string(vocab.LevelOrg) {
				orgUnits[r.metric] = r.units
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO period_usage (org_id, period, metric, level, team_id, user_id, units, month_limit)
			SELECT $1, $2, m, l, t, u, v, lim
			FROM unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[], $8::bigint[]) AS x(m, l, t, u, v, lim)`,
			org, period, metrics, levels, teams, users, units, lims); err != nil {
			return 0, nil, err
		}
	}
	return len(all), orgUnits, nil
}

// writeLines writes one billing line per metric used by the org or priced by its
// plan; Postgres computes the amount in numeric, so no float ever touches money.
func writeLines(ctx context.Context, tx pgx.Tx, org, period string, orgUnits map[string]int64, pricing *tenants.Pricing) ([]Line, error) {
	prices := map[string]tenants.MetricPrice{}
	currency := ""
	if pricing != nil {
		currency = pricing.Currency
		for _, m := range pricing.Metrics {
			prices[m.Metric] = m
			if _, ok := orgUnits[m.Metric]; !ok {
				orgUnits[m.Metric] = 0
			}
		}
	}
	var lines []Line
	for metric, units := range orgUnits {
		l := Line{Metric: metric, Units: units, Amount: "0", Currency: currency}
		price, priced := prices[metric]
		overagePrice := "0"
		if priced {
			l.IncludedUnits = price.IncludedUnits
			l.OverageUnits = max(units-price.IncludedUnits, 0)
			overagePrice = price.OveragePrice
		}
		if err := tx.QueryRow(ctx, `INSERT INTO billing_lines (org_id, period, metric, units, included_units, overage_units,
				priced, overage_price, amount, currency)
			VALUES ($1, $2, $3, $4, $5, $6::bigint, $7, $8::numeric, $6::bigint * $8::numeric, $9)
			RETURNING trim_scale(amount)::text`, org, period, metric, units, l.IncludedUnits, l.OverageUnits,
			priced, overagePrice, currency).Scan(&l.Amount); err != nil {
			return nil, err
		}
		lines = append(lines, l)
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].Metric < lines[j].Metric })
	return lines, nil
}
