package tenants

// Money: a plan's rate card (currency and rates), each org's operator overrides of
// rates, and the `spend` metric they price. Everything that computes money here is
// integer: a price is parsed once, exactly (math/big), into whole micro-units of its
// currency per `per` units, and never touches a float.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"golang.org/x/text/currency"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// SpendMetric is the metric of money: micro-units of the org's rate currency (1 USD
// = 1000000), counted by every priced check from its rates.
const SpendMetric = "spend"

// Micro is how many micro-units make one unit of a currency.
const Micro = 1_000_000

// maxRates bounds a rate card, as the spec bounds a list of limits.
const maxRates = 100

// Rate prices a metric: Price (a decimal string in currency units, at most 6 places)
// per Per units. Micros is Price in micro-units, filled when read or resolved.
type Rate struct {
	Metric string `json:"metric"`
	Price  string `json:"price"`
	Per    int64  `json:"per"`
	Micros int64  `json:"-"`
}

// pricePattern is a price as the API takes it: a plain decimal, no sign, no exponent,
// at most 6 places (whole micro-units).
var pricePattern = regexp.MustCompile(`^[0-9]{1,16}(\.[0-9]{1,6})?$`)

// ParsePrice parses a price into micro-units, exactly (math/big: no float is ever
// made of it); it is at most vocab.MaxUnits micro-units.
func ParsePrice(s string) (int64, error) {
	if !pricePattern.MatchString(s) {
		return 0, fmt.Errorf("must be a decimal such as 2.50 with at most 6 places (whole micro-units of the currency)")
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return 0, fmt.Errorf("must be a decimal such as 2.50")
	}
	r.Mul(r, big.NewRat(Micro, 1))
	if !r.IsInt() || r.Num().Cmp(big.NewInt(vocab.MaxUnits)) > 0 {
		return 0, fmt.Errorf("must be at most %s", FormatMicros(vocab.MaxUnits))
	}
	return r.Num().Int64(), nil
}

// ValidCurrency reports whether code is an ISO 4217 code in capitals (golang.org/x/text's
// table of currencies).
func ValidCurrency(code string) bool {
	if len(code) != 3 || strings.ToUpper(code) != code {
		return false
	}
	_, err := currency.ParseISO(code)
	return err == nil
}

// FormatMicros is micros as a plain decimal of currency units, with the fewest
// places that are exact (at least none): 2500000 -> "2.5". Export and JSON amounts.
func FormatMicros(micros int64) string {
	neg := micros < 0
	if neg {
		micros = -micros
	}
	s := strconv.FormatInt(micros/Micro, 10)
	if f := micros % Micro; f != 0 {
		s += "." + strings.TrimRight(fmt.Sprintf("%06d", f), "0")
	}
	if neg {
		s = "-" + s
	}
	return s
}

// FormatMoney is micros for people: grouped thousands, the currency's own places
// (2 for USD, 0 for JPY; more when the amount needs them) and its code:
// 2500000000 "USD" -> "2,500.00 USD". Without a currency, 2 places and no code.
func FormatMoney(micros int64, code string) string {
	places := 2
	if code != "" {
		if u, err := currency.ParseISO(code); err == nil {
			places, _ = currency.Standard.Rounding(u)
		}
	}
	neg := micros < 0
	if neg {
		micros = -micros
	}
	whole, frac := micros/Micro, micros%Micro
	fs := strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	for len(fs) < places {
		fs += "0"
	}
	ws := strconv.FormatInt(whole, 10)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range ws {
		if i > 0 && (len(ws)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if fs != "" {
		b.WriteString("." + fs)
	}
	if code != "" {
		b.WriteString(" " + code)
	}
	return b.String()
}

// validateRates checks a rate card's rates (field: "rates"): ids, not spend, each
// metric once, a price ParsePrice takes, per 1 to vocab.MaxUnits; it fills Micros.
func validateRates(errs *fieldErrs, field string, rates []Rate) {
	if len(rates) > maxRates {
		errs.add(field, "must hold at most %d rates", maxRates)
	}
	seen := map[string]bool{}
	for i := range rates {
		r := &rates[i]
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case !vocab.ValidID(r.Metric):
			errs.add(f+".metric", vocab.IDRule)
		case r.Metric == SpendMetric:
			errs.add(f+".metric", "spend is money itself: price the metrics that cost it")
		case seen[r.Metric]:
			errs.add(f+".metric", "repeats %q: each metric may have one rate", r.Metric)
		}
		seen[r.Metric] = true
		m, err := ParsePrice(r.Price)
		if err != nil {
			errs.add(f+".price", "%s", err.Error())
		}
		r.Micros = m
		if r.Per < 1 || r.Per > vocab.MaxUnits {
			errs.add(f+".per", "must be 1 to %d units", vocab.MaxUnits)
		}
	}
}

// validateRateCard checks a plan's currency and rates together: rates need a
// currency; so does a spend limit.
func validateRateCard(errs *fieldErrs, cur string, rates []Rate, limits []vocab.Limit) {
	if cur != "" && !ValidCurrency(cur) {
		errs.add("currency", "must be an ISO 4217 code in capitals such as USD")
	}
	validateRates(errs, "rates", rates)
	if cur == "" && len(rates) > 0 {
		errs.add("currency", "is required with rates: the currency their prices are in")
	}
	if cur == "" && slices.ContainsFunc(limits, func(l vocab.Limit) bool { return l.Metric == SpendMetric }) {
		errs.add("currency", "is required with a spend limit: the currency it counts")
	}
}

// normalizeRates sorts rates by metric and gives each its canonical price ("2.50" ->
// "2.5"); nil becomes empty.
func normalizeRates(rs []Rate) []Rate {
	out := make([]Rate, 0, len(rs))
	for _, r := range rs {
		if m, err := ParsePrice(r.Price); err == nil {
			r.Micros, r.Price = m, FormatMicros(m)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b Rate) int { return strings.Compare(a.Metric, b.Metric) })
	return out
}

// rateMetrics is the metrics rates price, and spend when there is a currency: what
// a rate card adds to the metrics an org knows.
func rateMetrics(cur string, rates []Rate) []string {
	out := make([]string, 0, len(rates)+1)
	for _, r := range rates {
		out = append(out, r.Metric)
	}
	if cur != "" {
		out = append(out, SpendMetric)
	}
	return out
}

// ratesOf loads the rates of the plans (or orgs) in ids from table (plan_rates with
// col plan_id, or org_rates with org_id), by owner.
func ratesOf(ctx context.Context, q querier, table, col string, ids []string) (map[string][]Rate, error) {
	rows, err := q.Query(ctx, `SELECT `+col+`, metric, price::text, per FROM `+table+` WHERE `+col+` = ANY($1) ORDER BY 1, 2`, ids)
	if err != nil {
		return nil, err
	}
	out := map[string][]Rate{}
	var owner string
	var r Rate
	_, err = pgx.ForEachRow(rows, []any{&owner, &r.Metric, &r.Price, &r.Per}, func() error {
		out[owner] = append(out[owner], normalizeRates([]Rate{{Metric: r.Metric, Price: trimDecimal(r.Price), Per: r.Per}})...)
		return nil
	})
	return out, err
}

// replaceRates writes owner's rates to table (col its owner column), replacing all.
func replaceRates(ctx context.Context, tx pgx.Tx, table, col, owner string, rates []Rate) error {
	if _, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE `+col+` = $1`, owner); err != nil {
		return err
	}
	for _, r := range rates {
		if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (`+col+`, metric, price, per) VALUES ($1, $2, $3::numeric, $4)`,
			owner, r.Metric, r.Price, r.Per); err != nil {
			return err
		}
	}
	return nil
}

// EffectiveRates is the plan's rates with the org's overrides in their place, by
// metric, sorted.
func EffectiveRates(plan, overrides []Rate) []Rate {
	out := slices.Clone(overrides)
	for _, r := range plan {
		if !slices.ContainsFunc(overrides, func(o Rate) bool { return o.Metric == r.Metric }) {
			out = append(out, r)
		}
	}
	return normalizeRates(out)
}

// OrgRates is an org's rate card: its plan's currency and rates, the operator's
// overrides, and the rates its checks are priced at (Effective).
type OrgRates struct {
	Org       string `json:"org"`
	Currency  string `json:"currency,omitempty"`
	Plan      []Rate `json:"plan_rates"`
	Overrides []Rate `json:"overrides"`
	Effective []Rate `json:"rates"`
}

// orgRates reads org's rate card.
func orgRates(ctx context.Context, q querier, orgID string) (OrgRates, error) {
	var out OrgRates
	var planID string
	var cur *string
	if err := q.QueryRow(ctx, `SELECT o.plan_id, p.rate_currency FROM orgs o JOIN plans p ON p.id = o.plan_id WHERE o.id = $1`,
		orgID).Scan(&planID, &cur); err != nil {
		return OrgRates{}, translate(err, fmt.Sprintf("org %q", orgID))
	}
	if cur != nil {
		out.Currency = *cur
	}
	pr, err := ratesOf(ctx, q, "plan_rates", "plan_id", []string{planID})
	if err != nil {
		return OrgRates{}, err
	}
	or, err := ratesOf(ctx, q, "org_rates", "org_id", []string{orgID})
	if err != nil {
		return OrgRates{}, err
	}
	out.Org, out.Plan, out.Overrides = orgID, normalizeRates(pr[planID]), normalizeRates(or[orgID])
	out.Effective = EffectiveRates(out.Plan, out.Overrides)
	return out, nil
}

// OrgRates returns org's rate card. Errors: ErrNotFound.
func (s *Service) OrgRates(ctx context.Context, orgID string) (OrgRates, error) {
	return orgRates(ctx, s.pool, orgID)
}

// SetOrgRates replaces org's overrides of its plan's rates (the operator's), audited
// as org.rates, and invalidates the org on every replica: checks decided after the
// change are priced at the new rates. An org whose plan has no currency cannot be
// given rates. Errors: *ValidationError (naming overrides[i].field, or currency),
// ErrNotFound.
func (s *Service) SetOrgRates(ctx context.Context, a Actor, orgID string, overrides []Rate) (OrgRates, error) {
	var errs fieldErrs
	validateRates(&errs, "rates", overrides)
	if err := errs.err(); err != nil {
		return OrgRates{}, err
	}
	var out OrgRates
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM orgs WHERE id = $1 FOR UPDATE`, orgID); err != nil {
			return err
		}
		before, err := orgRates(ctx, tx, orgID)
		if err != nil {
			return err
		}
		if before.Currency == "" && len(overrides) > 0 {
			errs.add("rates", "org %q's plan has no currency: give the plan a currency first", orgID)
			return errs.err()
		}
		if err := replaceRates(ctx, tx, "org_rates", "org_id", orgID, normalizeRates(overrides)); err != nil {
			return fmt.Errorf("set rates of org %q: %w", orgID, err)
		}
		if out, err = orgRates(ctx, tx, orgID); err != nil {
			return err
		}
		return audit(ctx, tx, a, orgID, "org.rates", "org:"+orgID, before, out)
	})
	if err != nil {
		return OrgRates{}, err
	}
	s.changed(orgID)
	return out, nil
}

// resolvedRatesSQL is the two columns of resolveOrgSQL that carry an org's rate card:
// its plan's currency and its effective rates as JSON (org overrides in place of the
// plan's).
const resolvedRatesSQL = `p.rate_currency,
	(SELECT coalesce(json_agg(json_build_object('metric', metric, 'price', price::text, 'per', per)), '[]') FROM (
		SELECT metric, price, per FROM org_rates WHERE org_id = o.id
		UNION ALL
		SELECT metric, price, per FROM plan_rates pr WHERE pr.plan_id = o.plan_id
			AND NOT EXISTS (SELECT 1 FROM org_rates x WHERE x.org_id = o.id AND x.metric = pr.metric)) r)`

// decodeRates fills r's rate card from resolvedRatesSQL's columns.
func decodeRates(r *ResolvedOrg, cur *string, raw []byte) error {
	if cur == nil {
		return nil
	}
	var rs []Rate
	if err := json.Unmarshal(raw, &rs); err != nil {
		return err
	}
	r.Currency = *cur
	r.Rates = make(map[string]Rate, len(rs))
	for _, x := range normalizeRates(rs) {
		r.Rates[x.Metric] = x
	}
	return nil
}

// mapValues is the rates of m, in no order.
func mapValues(m map[string]Rate) []Rate {
	out := make([]Rate, 0, len(m))
	for _, r := range m {
		out = append(out, r)
	}
	return out
}

// patchRateCard applies a plan patch's currency and rates to after and checks the
// card whole (rates need a currency, so does a spend limit).
func patchRateCard(after *Plan, patch PlanPatch) error {
	if patch.Currency != nil {
		after.Currency = *patch.Currency
	}
	if patch.Rates != nil {
		after.Rates = normalizeRates(*patch.Rates)
	}
	if patch.Currency == nil && patch.Rates == nil && patch.Limits == nil {
		return nil
	}
	var errs fieldErrs
	validateRateCard(&errs, after.Currency, after.Rates, after.Limits)
	return errs.err()
}

// inMoney says the spend violations of an *AllocationError in money of the currency
// of planID's rate card ("team \"eng\": spend/month budget 2,500.00 USD exceeds org
// \"acme\"'s 2,000.00 USD"); any other error, or violation, is returned as it is.
func inMoney(ctx context.Context, q querier, planID string, err error) error {
	ae, ok := err.(*AllocationError)
	if !ok || !slices.ContainsFunc(ae.Violations, func(v Violation) bool { return v.Metric == SpendMetric }) {
		return err
	}
	var cur string
	if e := q.QueryRow(ctx, `SELECT coalesce(rate_currency, '') FROM plans WHERE id = $1`, planID).Scan(&cur); e != nil {
		return err
	}
	for i := range ae.Violations {
		v := &ae.Violations[i]
		if v.Metric != SpendMetric {
			continue
		}
		m := func(n int64) string { return FormatMoney(n, cur) }
		child, _, _ := strings.Cut(v.Message, ": ")
		switch v.rule {
		case "above":
			v.Message = fmt.Sprintf("%s: spend/%s budget %s exceeds %s's %s", child, v.Window, m(v.Requested), v.Parent, m(v.ParentMax))
		case "sum":
			v.Message = fmt.Sprintf("%s: spend/month budget %s exceeds the %s left of %s's %s (%s is already allocated)",
				child, m(v.Requested), m(max(0, v.ParentMax-v.Allocated)), v.Parent, m(v.ParentMax), m(v.Allocated))
		case "below":
			v.Message = fmt.Sprintf("%s: spend/%s budget %s is below the %s one of its children holds", v.Parent, v.Window, m(v.ParentMax), m(v.Allocated))
		case "below-sum":
			v.Message = fmt.Sprintf("%s: spend/month budget %s is below the %s already allocated to its children", v.Parent, m(v.ParentMax), m(v.Allocated))
		case "burst-above":
			v.Message = fmt.Sprintf("%s: spend/%s burst %s exceeds %s's burst %s", child, v.Window, m(v.Requested), v.Parent, m(v.ParentMax))
		case "burst-below":
			v.Message = fmt.Sprintf("%s: spend/%s burst %s is below the %s one of its children holds", v.Parent, v.Window, m(v.ParentMax), m(v.Allocated))
		}
	}
	return ae
}
