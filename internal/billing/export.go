package billing

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// Row is one line of a billing export. Detail rows carry the units of a user (team
// and user set) or the units counted at a team without a user (user empty); the org
// total row of each metric (team and user empty) carries the org's units with the
// included units, overage and amount under the plan's pricing.
type Row struct {
	Period        string `json:"period"`
	Org           string `json:"org"`
	Team          string `json:"team"`
	User          string `json:"user"`
	Metric        string `json:"metric"`
	Units         int64  `json:"units"`
	IncludedUnits int64  `json:"included_units"`
	OverageUnits  int64  `json:"overage_units"`
	Amount        string `json:"amount"`
	Currency      string `json:"currency"`
	// GrantedUnits is what the org's grants added to its month limit of the metric in
	// the period (org total rows; 0 elsewhere): every grant active at some time of the
	// period counts whole. It raises the cap, not the included units: units used
	// above IncludedUnits are overage whether or not a grant let them through.
	GrantedUnits int64 `json:"granted_units"`
	// Money: SpendAmount is the row's spend, a decimal amount of SpendCurrency (the
	// org's rate currency): the spend row's units, or a priced metric's units at
	// RatePrice per RatePer units (rounded up to a micro-unit). "" (and RatePer 0) when
	// the row is neither. The rate is the org's rate at the time of the export; `spend`
	// rows are what was counted, decision by decision.
	SpendAmount   string `json:"spend_amount"`
	SpendCurrency string `json:"spend_currency"`
	RatePrice     string `json:"rate_price"`
	RatePer       int64  `json:"rate_per"`
}

// CSVHeader is the header line of a CSV export.
var CSVHeader = []string{"period", "org", "team", "user", "metric", "units", "included_units", "overage_units", "amount", "currency", "granted_units",
	"spend_amount", "spend_currency", "rate_price", "rate_per"} // money: at the end

// Format is an export format.
type Format string

// The export formats.
const (
	CSV  Format = "csv"
	JSON Format = "json"
)

// exportSQL produces the rows of one period for the orgs of $2 (a page of them),
// ordered by org, then detail rows by team and user, then the org totals. A closed
// org's rows come from its immutable period rows plus late adjustments and the
// pricing recorded at close; an open period's from the ledger (at most one flush
// interval behind Redis) and the plan's current pricing. It reads orgs, plans and
// plan_prices of the tenancy schema for open periods only, and its grants (with the
// org's billing anchor day, which places the period) for every period.
const exportSQL = `
WITH closed AS (
    SELECT org_id, currency FROM billing_periods WHERE period = $1 AND org_id = ANY($2)
),
u AS (
    SELECT org_id, metric, level, team_id, user_id, sum(units)::bigint AS units FROM (
        SELECT org_id, metric, level, team_id, user_id, units FROM period_usage
        WHERE period = $1 AND org_id = ANY($2)
        UNION ALL
        SELECT org_id, metric, level, team_id, user_id, units FROM usage_adjustments
        WHERE period = $1 AND org_id = ANY($2)
        UNION ALL
        SELECT org_id, metric, level, team_id, user_id, units FROM usage_counters c
        WHERE period = $1 AND org_id = ANY($2) AND NOT EXISTS (SELECT 1 FROM closed WHERE closed.org_id = c.org_id)
    ) x GROUP BY 1, 2, 3, 4, 5
),
cur AS (
    SELECT org_id, currency FROM closed
    UNION ALL
    SELECT o.id, coalesce(p.currency, '') FROM orgs o JOIN plans p ON p.id = o.plan_id
    WHERE o.id = ANY($2) AND NOT EXISTS (SELECT 1 FROM closed WHERE closed.org_id = o.id)
),
prices AS (
    SELECT org_id, metric, included_units, overage_price FROM billing_lines
    WHERE period = $1 AND org_id = ANY($2) AND priced
    UNION ALL
    SELECT o.id, pp.metric, pp.included_units, pp.overage_price FROM orgs o JOIN plan_prices pp ON pp.plan_id = o.plan_id
    WHERE o.id = ANY($2) AND NOT EXISTS (SELECT 1 FROM closed WHERE closed.org_id = o.id)
      AND EXISTS (SELECT 1 FROM u WHERE u.org_id = o.id)
),
uw AS (
    -- the units of a team's users beside each row, by a window rather than a join to
    -- a per-team aggregate (which a planner without statistics nested: quadratic)
    SELECT u.*, coalesce(sum(units) FILTER (WHERE level = 'user') OVER (PARTITION BY org_id, team_id, metric), 0) AS usersum
    FROM u
),
totals AS (
    SELECT coalesce(t.org_id, pr.org_id) AS org_id, coalesce(t.metric, pr.metric) AS metric,
           coalesce(t.units, 0) AS units, pr.included_units, pr.overage_price
    FROM (SELECT org_id, metric, units FROM u WHERE level = 'org') t
    FULL JOIN prices pr ON pr.org_id = t.org_id AND pr.metric = t.metric
),
granted AS (
    SELECT g.org_id, g.metric, sum(g.units)::bigint AS units
    FROM grants g JOIN orgs o ON o.id = g.org_id,
         LATERAL (SELECT (to_date($1 || '-01', 'YYYY-MM-DD') + (o.billing_anchor_day - 1))::timestamp AT TIME ZONE 'UTC' AS start) p
    WHERE g.org_id = ANY($2)
      AND g.created_at < p.start + interval '1 month' AND least(g.revoked_at, g.until) > p.start
    GROUP BY 1, 2
),
rcur AS ( -- money: each org's rate currency and effective rates
    SELECT o.id AS org_id, p.rate_currency AS cur FROM orgs o JOIN plans p ON p.id = o.plan_id
    WHERE o.id = ANY($2) AND p.rate_currency IS NOT NULL
),
rates AS (
    SELECT org_id, metric, price, per FROM org_rates WHERE org_id = ANY($2)
    UNION ALL
    SELECT o.id, pr.metric, pr.price, pr.per FROM orgs o JOIN plan_rates pr ON pr.plan_id = o.plan_id
    WHERE o.id = ANY($2) AND NOT EXISTS (SELECT 1 FROM org_rates x WHERE x.org_id = o.id AND x.metric = pr.metric)
)
SELECT r.org_id, r.team_id, r.user_id, r.metric, r.units, r.included, r.overage,
       trim_scale(r.amount)::text, coalesce(cur.currency, ''), CASE WHEN r.ord = 1 THEN coalesce(gr.units, 0) ELSE 0 END,
       CASE WHEN rc.cur IS NULL THEN ''
            WHEN r.metric = 'spend' THEN trim_scale(r.units::numeric / 1000000)::text
            WHEN rt.price IS NOT NULL THEN trim_scale(div(r.units::numeric * rt.price * 1000000 + rt.per - 1, rt.per) / 1000000)::text
            ELSE '' END,
       CASE WHEN rc.cur IS NOT NULL AND (r.metric = 'spend' OR rt.price IS NOT NULL) THEN rc.cur ELSE '' END,
       coalesce(trim_scale(rt.price)::text, ''), coalesce(rt.per, 0)
FROM (
    SELECT org_id, team_id, user_id, metric, units, 0::bigint AS included, 0::bigint AS overage, 0::numeric AS amount, 0 AS ord
    FROM u WHERE level = 'user'
    UNION ALL
    SELECT org_id, team_id, '', metric, units - usersum, 0, 0, 0, 0
    FROM uw WHERE level = 'team' AND units > usersum
    UNION ALL
    SELECT org_id, '', '', metric, units, coalesce(included_units, 0),
           CASE WHEN included_units IS NULL THEN 0 ELSE greatest(units - included_units, 0) END,
           CASE WHEN included_units IS NULL THEN 0 ELSE greatest(units - included_units, 0) * overage_price END, 1
    FROM totals
) r LEFT JOIN cur USING (org_id) LEFT JOIN granted gr ON gr.org_id = r.org_id AND gr.metric = r.metric
  LEFT JOIN rcur rc ON rc.org_id = r.org_id LEFT JOIN rates rt ON rt.org_id = r.org_id AND rt.metric = r.metric AND rc.cur IS NOT NULL
ORDER BY r.org_id, r.ord, r.team_id, r.user_id, r.metric`

// exportPage is how many orgs one export query covers: the first rows leave after
// the first page's query, not the whole period's, and a plan that goes wrong for
// want of statistics costs a page, not the export.
const exportPage = 100

// Export calls fn with each row of period, for org ("" for every org), in order,
// reading them from Postgres as they come, a page of orgs (exportPage) per query:
// memory does not grow with the rows, and the first row comes after the first page.
//
// Each query runs with nested loops off: on a database never analysed the planner
// takes the CTEs for a row or two and nests them, quadratic in the orgs; its joins are
// all equalities, so hash joins always exist, and they are linear whatever the
// estimates.
func (s *Store) Export(ctx context.Context, org, period string, fn func(*Row) error) error {
	if err := ParsePeriod(period); err != nil {
		return err
	}
	if org != "" {
		return s.exportOrgs(ctx, period, []string{org}, fn)
	}
	after := ""
	for {
		rows, err := s.pool.Query(ctx, `SELECT id FROM orgs WHERE id > $1 ORDER BY id LIMIT $2`, after, exportPage)
		if err != nil {
			return fmt.Errorf("export %s: %w", period, err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("export %s: %w", period, err)
		}
		if len(ids) == 0 {
			return nil
		}
		if err := s.exportOrgs(ctx, period, ids, fn); err != nil {
			return err
		}
		if len(ids) < exportPage {
			return nil
		}
		after = ids[len(ids)-1]
	}
}

func (s *Store) exportOrgs(ctx context.Context, period string, orgs []string, fn func(*Row) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL enable_nestloop = off`); err != nil {
			return fmt.Errorf("export %s: %w", period, err)
		}
		rows, err := tx.Query(ctx, exportSQL, period, orgs)
		if err != nil {
			return fmt.Errorf("export %s: %w", period, err)
		}
		defer rows.Close()
		r := Row{Period: period}
		for rows.Next() {
			if err := rows.Scan(&r.Org, &r.Team, &r.User, &r.Metric, &r.Units, &r.IncludedUnits, &r.OverageUnits,
				&r.Amount, &r.Currency, &r.GrantedUnits,
				&r.SpendAmount, &r.SpendCurrency, &r.RatePrice, &r.RatePer); err != nil {
				return fmt.Errorf("export %s: %w", period, err)
			}
			if err := fn(&r); err != nil {
				return err
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("export %s: %w", period, err)
		}
		return nil
	})
}

// WriteExport streams the export of period (one org, or every org when org is "")
// to w in format, flushing every flushEvery rows when w has a Flush method (an HTTP
// response). A JSON export that fails midway is left unterminated, so a reader sees
// it is incomplete.
func (s *Store) WriteExport(ctx context.Context, w io.Writer, org, period string, format Format) error {
	const flushEvery = 1000
	bw := bufio.NewWriterSize(w, 64<<10)
	flusher, _ := w.(interface{ Flush() })
	n := 0
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	switch format {
	case CSV:
		cw := csv.NewWriter(bw)
		if err := cw.Write(CSVHeader); err != nil {
			return err
		}
		rec := make([]string, len(CSVHeader))
		err := s.Export(ctx, org, period, func(r *Row) error {
			rec[0], rec[1], rec[2], rec[3], rec[4] = r.Period, r.Org, r.Team, r.User, r.Metric
			rec[5] = strconv.FormatInt(r.Units, 10)
			rec[6] = strconv.FormatInt(r.IncludedUnits, 10)
			rec[7] = strconv.FormatInt(r.OverageUnits, 10)
			rec[8], rec[9] = r.Amount, r.Currency
			rec[10] = strconv.FormatInt(r.GrantedUnits, 10)
			rec[11], rec[12], rec[13], rec[14] = r.SpendAmount, r.SpendCurrency, r.RatePrice, strconv.FormatInt(r.RatePer, 10)
			if err := cw.Write(rec); err != nil {
				return err
			}
			if n++; n%flushEvery == 0 {
				cw.Flush()
				return flush()
			}
			return nil
		})
		cw.Flush()
		if err != nil {
			_ = flush()
			return err
		}
		if err := cw.Error(); err != nil {
			return err
		}
		return flush()
	case JSON:
		if _, err := bw.WriteString("["); err != nil {
			return err
		}
		enc := json.NewEncoder(bw)
		err := s.Export(ctx, org, period, func(r *Row) error {
			if n > 0 {
				if err := bw.WriteByte(','); err != nil {
					return err
				}
			}
			if err := enc.Encode(r); err != nil { // one row per line
				return err
			}
			if n++; n%flushEvery == 0 {
				return flush()
			}
			return nil
		})
		if err != nil {
			_ = flush()
			return err
		}
		if _, err := bw.WriteString("]\n"); err != nil {
			return err
		}
		return flush()
	}
	return badFormat(format)
}

// ReadCSV parses a CSV export, calling fn with each row; for tests and tools.
func ReadCSV(r io.Reader, fn func(Row) error) error {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return err
	}
	if len(head) != len(CSVHeader) {
		return fmt.Errorf("csv header %v", head)
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var row Row
		row.Period, row.Org, row.Team, row.User, row.Metric = rec[0], rec[1], rec[2], rec[3], rec[4]
		if row.Units, err = strconv.ParseInt(rec[5], 10, 64); err != nil {
			return err
		}
		if row.IncludedUnits, err = strconv.ParseInt(rec[6], 10, 64); err != nil {
			return err
		}
		if row.OverageUnits, err = strconv.ParseInt(rec[7], 10, 64); err != nil {
			return err
		}
		row.Amount, row.Currency = rec[8], rec[9]
		if row.GrantedUnits, err = strconv.ParseInt(rec[10], 10, 64); err != nil {
			return err
		}
		row.SpendAmount, row.SpendCurrency, row.RatePrice = rec[11], rec[12], rec[13]
		if row.RatePer, err = strconv.ParseInt(rec[14], 10, 64); err != nil {
			return err
		}
		if err := fn(row); err != nil {
			return err
		}
	}
}

// ReadJSON parses a JSON export as a stream, calling fn with each row.
func ReadJSON(r io.Reader, fn func(Row) error) error {
	dec := json.NewDecoder(r)
	if _, err := dec.Token(); err != nil {
		return err
	}
	for dec.More() {
		var row Row
		if err := dec.Decode(&row); err != nil {
			return err
		}
		if err := fn(row); err != nil {
			return err
		}
	}
	_, err := dec.Token()
	return err
}
