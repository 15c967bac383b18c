package tenants

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

const planCols = `id, name, metered, fail_mode, leases, client_leases, sliding_windows, pool, currency, coalesce(base_price::text, ''), created_at, updated_at,
	coalesce(rate_currency, ''), weight`

func scanPlan(row pgx.Row) (Plan, error) {
	var p Plan
	var currency *string
	var base string
	if err := row.Scan(&p.ID, &p.Name, &p.Metered, &p.FailMode, &p.Leases, &p.ClientLeases, &p.SlidingWindows, &p.Pool, &currency, &base, &p.CreatedAt, &p.UpdatedAt,
		&p.Currency, &p.Weight); err != nil {
		return Plan{}, err
	}
	p.Metered = normalizeMetered(p.Metered)
	if currency != nil {
		p.Pricing = &Pricing{Currency: *currency, BasePrice: trimDecimal(base), Metrics: []MetricPrice{}}
	}
	return p, nil
}

// trimDecimal drops the trailing zeros Postgres pads numerics with: "49.000000" ->
// "49", "0.000100" -> "0.0001".
func trimDecimal(s string) string {
	if strings.Contains(s, ".") {
		s = strings.TrimSuffix(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// fillPlans loads the limits and prices of the plans given.
func fillPlans(ctx context.Context, q querier, plans []Plan) error {
	if len(plans) == 0 {
		return nil
	}
	ids := make([]string, len(plans))
	for i, p := range plans {
		ids[i] = p.ID
	}
	limits, err := limitsOf(ctx, q, `SELECT plan_id, `+limitCols+` FROM plan_limits WHERE plan_id = ANY($1)`, ids)
	if err != nil {
		return err
	}
	rows, err := q.Query(ctx, `SELECT plan_id, metric, included_units, overage_price::text FROM plan_prices
		WHERE plan_id = ANY($1) ORDER BY plan_id, metric`, ids)
	if err != nil {
		return err
	}
	prices := map[string][]MetricPrice{}
	var owner string
	var mp MetricPrice
	if _, err := pgx.ForEachRow(rows, []any{&owner, &mp.Metric, &mp.IncludedUnits, &mp.OveragePrice}, func() error {
		mp.OveragePrice = trimDecimal(mp.OveragePrice)
		prices[owner] = append(prices[owner], mp)
		return nil
	}); err != nil {
		return err
	}
	rates, err := ratesOf(ctx, q, "plan_rates", "plan_id", ids) // money
	if err != nil {
		return err
	}
	for i := range plans {
		plans[i].Rates = normalizeRates(rates[plans[i].ID])
		plans[i].Limits = normalize(limits[plans[i].ID])
		if plans[i].Pricing != nil {
			plans[i].Pricing.Metrics = append([]MetricPrice{}, prices[plans[i].ID]...)
		}
	}
	return planFeatures(ctx, q, plans)
}

func getPlan(ctx context.Context, q querier, id string, forUpdate bool) (Plan, error) {
	sql := `SELECT ` + planCols + ` FROM plans WHERE id = $1`
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	p, err := scanPlan(q.QueryRow(ctx, sql, id))
	if err != nil {
		return Plan{}, translate(err, fmt.Sprintf("plan %q", id))
	}
	ps := []Plan{p}
	if err := fillPlans(ctx, q, ps); err != nil {
		return Plan{}, fmt.Errorf("plan %q: %w", id, err)
	}
	return ps[0], nil
}

func writePlanDetails(ctx context.Context, tx pgx.Tx, p Plan) error {
	err := replaceLimits(ctx, tx, `DELETE FROM plan_limits WHERE plan_id = $1`, []any{p.ID},
		`INSERT INTO plan_limits (plan_id, metric, time_window, max_units, burst, fair_share)
		 SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::boolean[])`, p.Limits, true)
	if err != nil {
		return err
	}
	if err := writePlanFeatures(ctx, tx, p.ID, p.Features); err != nil {
		return err
	}
	if err := replaceRates(ctx, tx, "plan_rates", "plan_id", p.ID, normalizeRates(p.Rates)); err != nil { // money
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM plan_prices WHERE plan_id = $1`, p.ID); err != nil {
		return err
	}
	if p.Pricing == nil {
		return nil
	}
	for _, m := range p.Pricing.Metrics {
		if _, err := tx.Exec(ctx, `INSERT INTO plan_prices (plan_id, metric, included_units, overage_price)
			VALUES ($1, $2, $3, $4::numeric)`, p.ID, m.Metric, m.IncludedUnits, m.OveragePrice); err != nil {
			return err
		}
	}
	return nil
}

func pricingCols(p *Pricing) (currency, base *string) {
	if p == nil {
		return nil, nil
	}
	return &p.Currency, &p.BasePrice
}

// CreatePlan creates a plan.
func (s *Service) CreatePlan(ctx context.Context, a Actor, in PlanInput) (Plan, error) {
	if err := in.Validate(); err != nil {
		return Plan{}, err
	}
	if in.Pool == "" {
		in.Pool = "default"
	}
	if in.Leases == "" {
		in.Leases = LeasesAuto
	}
	if in.ClientLeases == "" {
		in.ClientLeases = LeasesAuto
	}
	if in.SlidingWindows == "" {
		in.SlidingWindows = WindowsEstimate
	}
	if in.Weight == 0 {
		in.Weight = 1
	}
	var out Plan
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		cur, base := pricingCols(in.Pricing)
		_, err := tx.Exec(ctx, `INSERT INTO plans (id, name, metered, fail_mode, pool, currency, base_price, leases, sliding_windows, weight, client_leases)
			VALUES ($1, $2, $3, $4, $5, $6, $7::numeric, $8, $9, $10, $11)`, in.ID, in.Name, normalizeMetered(in.Metered), in.FailMode, in.Pool, cur, base, in.Leases, in.SlidingWindows, in.Weight,
			in.ClientLeases)
		if err != nil {
			return translate(err, fmt.Sprintf("create plan %q", in.ID))
		}
		if in.Currency != "" { // money
			if _, err := tx.Exec(ctx, `UPDATE plans SET rate_currency = $2 WHERE id = $1`, in.ID, in.Currency); err != nil {
				return err
			}
		}
		p := Plan{ID: in.ID, Limits: normalize(in.Limits), Pricing: in.Pricing, Rates: in.Rates, Features: in.Features}
		if err := writePlanDetails(ctx, tx, p); err != nil {
			return fmt.Errorf("create plan %q: %w", in.ID, err)
		}
		if out, err = getPlan(ctx, tx, in.ID, false); err != nil {
			return err
		}
		return audit(ctx, tx, a, "", "plan.create", "plan:"+in.ID, nil, out)
	})
	return out, err
}

// GetPlan returns the plan with id.
func (s *Service) GetPlan(ctx context.Context, id string) (Plan, error) {
	return getPlan(ctx, s.pool, id, false)
}

// ListPlans returns one page of plans ordered by id, and the cursor of the next page.
func (s *Service) ListPlans(ctx context.Context, page Page) ([]Plan, string, error) {
	plans, next, err := listPage(ctx, s.pool, "plans", page, `SELECT `+planCols+` FROM plans WHERE id > $1 ORDER BY id LIMIT $2`,
		scanPlan, func(p Plan) string { return p.ID })
	if err == nil {
		err = fillPlans(ctx, s.pool, plans)
	}
	return plans, next, err
}

// UpdatePlan changes a plan. New limits are checked against the teams of every org on
// the plan (with each org's overrides applied): a plan may not drop below what an
// org has allocated unless that org oversubscribes.
func (s *Service) UpdatePlan(ctx context.Context, a Actor, id string, patch PlanPatch) (Plan, error) {
	if err := patch.Validate(); err != nil {
		return Plan{}, err
	}
	var out Plan
	var orgIDs []string
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		before, err := getPlan(ctx, tx, id, true)
		if err != nil {
			return err
		}
		after := before
		if patch.Name != nil {
			after.Name = *patch.Name
		}
		if patch.FailMode != nil {
			after.FailMode = *patch.FailMode
		}
		if patch.Leases != nil {
			after.Leases = *patch.Leases
		}
		if patch.ClientLeases != nil {
			after.ClientLeases = *patch.ClientLeases
		}
		if patch.SlidingWindows != nil {
			after.SlidingWindows = *patch.SlidingWindows
		}
		if patch.Pool != nil {
			after.Pool = *patch.Pool
		}
		if patch.Pricing != nil {
			after.Pricing = patch.Pricing
		}
		if patch.RemovePricing {
			after.Pricing = nil
		}
		if patch.Limits != nil {
			after.Limits = normalize(*patch.Limits)
		}
		if patch.Metered != nil {
			after.Metered = normalizeMetered(*patch.Metered)
		}
		if patch.Features != nil {
			after.Features = *patch.Features
		}
		if patch.Weight != nil {
			after.Weight = *patch.Weight
		}
		if err := patchRateCard(&after, patch); err != nil { // money
			return err
		}
		rows, err := tx.Query(ctx, `SELECT id FROM orgs WHERE plan_id = $1 ORDER BY id FOR UPDATE`, id)
		if err != nil {
			return err
		}
		if orgIDs, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		if patch.Limits != nil || patch.Metered != nil || patch.Pricing != nil || patch.RemovePricing || patch.Rates != nil || patch.Currency != nil {
			var vs []Violation
			for _, orgID := range orgIDs {
				org, err := getOrg(ctx, tx, orgID, s.now())
				if err != nil {
					return err
				}
				if patch.Limits != nil {
					eff := MergeLimits(after.Limits, org.Limits)
					v, err := checkOrgCoversTeams(ctx, tx, org.ID, eff, org.Oversubscribe)
					if err != nil {
						return err
					}
					vs = append(vs, fieldFor(v, "limits", *patch.Limits, "limits")...)
				}
				v, err := forgottenMetrics(ctx, tx, org.ID, planKnows(after, org.Limits), patchedMetricField(patch))
				if err != nil {
					return err
				}
				vs = append(vs, v...)
			}
			if err := inMoney(ctx, tx, id, allocErr(vs)); err != nil {
				return fmt.Errorf("update plan %q: %w", id, err)
			}
		}
		cur, base := pricingCols(after.Pricing)
		_, err = tx.Exec(ctx, `UPDATE plans SET name = $2, fail_mode = $3, pool = $4, currency = $5,
			base_price = $6::numeric, metered = $7, leases = $8, sliding_windows = $9, weight = $10, client_leases = $11, updated_at = now() WHERE id = $1`,
			id, after.Name, after.FailMode, after.Pool, cur, base, after.Metered, after.Leases, after.SlidingWindows, after.Weight, after.ClientLeases)
		if err != nil {
			return fmt.Errorf("update plan %q: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE plans SET rate_currency = nullif($2, '') WHERE id = $1`, id, after.Currency); err != nil { // money
			return fmt.Errorf("update plan %q: %w", id, err)
		}
		if err := writePlanDetails(ctx, tx, after); err != nil {
			return fmt.Errorf("update plan %q: %w", id, err)
		}
		if out, err = getPlan(ctx, tx, id, false); err != nil {
			return err
		}
		return audit(ctx, tx, a, "", "plan.update", "plan:"+id, before, out)
	})
	if err == nil {
		s.changed(orgIDs...)
	}
	return out, err
}

// patchedMetricField names the field of a plan patch that can make an org forget a
// metric: the first of metered, limits and pricing that it sets.
func patchedMetricField(p PlanPatch) string {
	switch {
	case p.Metered != nil:
		return "metered"
	case p.Limits != nil:
		return "limits"
	case p.Rates != nil:
		return "rates"
	case p.Currency != nil:
		return "currency"
	default:
		return "pricing"
	}
}

// fieldFor points each violation of effective limits at the request field that
// caused it: the limit (or, for a burst rule, the burst) at its index in the
// request's list when the request set that metric and window, else fallback.
func fieldFor(vs []Violation, listField string, requested []vocab.Limit, fallback string) []Violation {
	for i := range vs {
		attr := "limit"
		if strings.HasPrefix(vs[i].rule, "burst-") {
			attr = "burst"
		}
		vs[i].Field = fallback
		for j, l := range requested {
			if l.Metric == vs[i].Metric && l.Window == vs[i].Window {
				vs[i].Field = fmt.Sprintf("%s[%d].%s", listField, j, attr)
			}
		}
	}
	return vs
}
