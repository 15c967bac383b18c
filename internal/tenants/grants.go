package tenants

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// A grant (top-up) adds units to an org's month limit of one metric from when it is
// made until Until (by default the end of the billing period it is made in), unless
// it is revoked before. While active its units are added to the org's month limit in
// EffectiveLimits, so checks, the allocation rules (teams may be allocated out of
// the larger limit) and usage see them; it lapses by itself: resolution compares
// Until with the service's clock, and the cache reads an org again when its first
// grant lapses (Org.GrantsLapse). An org must have a month limit of the metric:
// a grant of anything else is refused with ErrOverAllocated (422), since there is no
// cap to raise.
//
// When a grant lapses or is revoked the teams keep their allocations, which may then
// add up to more than the org's month limit: like oversubscription, the org's own
// counter still caps the org, and the next change of an allocation is checked
// against the lower limit.

// Grant is units added to an org's month limit of a metric for a while.
type Grant struct {
	ID        string     `json:"id"`
	OrgID     string     `json:"org"`
	Metric    string     `json:"metric"`
	Units     int64      `json:"units"`
	Reason    string     `json:"reason"`
	Until     time.Time  `json:"until"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// Active reports whether the grant raises its org's limit at t.
func (g Grant) Active(t time.Time) bool {
	return g.RevokedAt == nil && !t.Before(g.CreatedAt) && t.Before(g.Until)
}

// GrantInput asks for a grant. A zero Until means the end of the org's current
// billing period.
type GrantInput struct {
	Metric string
	Units  int64
	Reason string
	Until  time.Time
}

// maxGrantUnits bounds one grant: vocab.MaxUnits, what a counter holds exactly. The
// month limit a grant raises is capped at vocab.MaxUnits too (applyGrants), however
// many grants there are.
const maxGrantUnits = vocab.MaxUnits

// maxGrantSpan bounds how far ahead a grant may run.
const maxGrantSpan = 366 * 24 * time.Hour

// validate checks the input against now.
func (in GrantInput) validate(now time.Time) error {
	var errs fieldErrs
	if !vocab.ValidID(in.Metric) {
		errs.add("metric", vocab.IDRule)
	}
	if in.Units <= 0 || in.Units > maxGrantUnits {
		errs.add("units", "must be 1 to %d", maxGrantUnits)
	}
	if r := strings.TrimSpace(in.Reason); r == "" || utf8.RuneCountInString(in.Reason) > 500 {
		errs.add("reason", "must say why, in 1 to 500 characters")
	}
	if !in.Until.IsZero() {
		if !in.Until.After(now) {
			errs.add("until", "must be in the future")
		} else if in.Until.Sub(now) > maxGrantSpan {
			errs.add("until", "must be within a year")
		}
	}
	return errs.err()
}

const grantCols = `id, org_id, metric, units, reason, until, created_at, revoked_at`

func scanGrant(row pgx.Row) (Grant, error) {
	var g Grant
	err := row.Scan(&g.ID, &g.OrgID, &g.Metric, &g.Units, &g.Reason, &g.Until, &g.CreatedAt, &g.RevokedAt)
	return g, err
}

// CreateGrant adds units to an org's month limit of a metric. The metric must be one
// the org knows (else *UnknownMetricError) and have a month limit (else
// *AllocationError). Operator only: authorization is the caller's.
func (s *Service) CreateGrant(ctx context.Context, a Actor, orgID string, in GrantInput) (Grant, error) {
	now := s.now().UTC().Truncate(time.Microsecond) // what Postgres keeps
	if err := in.validate(now); err != nil {
		return Grant{}, err
	}
	idb := make([]byte, 8)
	_, _ = rand.Read(idb)
	id := "gr_" + hex.EncodeToString(idb)
	var out Grant
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		org, err := lockOrg(ctx, tx, orgID, now)
		if err != nil {
			return err
		}
		known, err := orgMetrics(ctx, tx, org)
		if err != nil {
			return err
		}
		if err := known.Check(in.Metric); err != nil {
			return fmt.Errorf("grant to org %q: %w", orgID, err)
		}
		if _, ok := index(org.EffectiveLimits)[limitKey{in.Metric, vocab.Month}]; !ok {
			return fmt.Errorf("grant to org %q: %w", orgID, &AllocationError{Violations: []Violation{{
				Field: "metric", Metric: in.Metric, Window: vocab.Month, Parent: fmt.Sprintf("org %q", orgID), Requested: in.Units,
				Message: fmt.Sprintf("org %q has no month limit of %q to raise: a grant adds to a month limit", orgID, in.Metric)}}})
		}
		until := in.Until
		if until.IsZero() {
			until = vocab.PeriodAt(now, org.BillingAnchorDay).End
		}
		out, err = scanGrant(tx.QueryRow(ctx, `INSERT INTO grants (id, org_id, metric, units, reason, until, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING `+grantCols, id, orgID, in.Metric, in.Units, in.Reason, until, now))
		if err != nil {
			return translate(err, fmt.Sprintf("grant to org %q", orgID))
		}
		return audit(ctx, tx, a, orgID, "grant.create", "grant:"+id, nil, out)
	})
	if err != nil {
		return Grant{}, err
	}
	s.changed(orgID)
	return out, nil
}

// ListGrants returns one page of an org's grants, newest first, revoked and lapsed
// ones included. ErrNotFound when the org does not exist.
func (s *Service) ListGrants(ctx context.Context, orgID string, page Page) ([]Grant, string, error) {
	if _, err := getOrg(ctx, s.pool, orgID, s.now()); err != nil {
		return nil, "", err
	}
	// Ids are random: the cursor is the last grant's id, the page the grants made
	// before it (or at the same instant with a smaller id).
	return listPage(ctx, s.pool, "grants", page, `SELECT `+grantCols+` FROM grants g WHERE org_id = $1
		AND ($2 = '' OR (created_at, id) < (SELECT created_at, id FROM grants WHERE org_id = $1 AND id = $2))
		ORDER BY created_at DESC, id DESC LIMIT $3`, scanGrant, func(g Grant) string { return g.ID }, orgID)
}

// RevokeGrant ends a grant at once; the org's limit drops back on every replica.
// Revoking a revoked or lapsed grant changes nothing. ErrNotFound when the org or
// the grant (of that org) does not exist. Operator only: authorization is the caller's.
func (s *Service) RevokeGrant(ctx context.Context, a Actor, orgID, grantID string) error {
	now := s.now().UTC().Truncate(time.Microsecond)
	changed := false
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := lockOrg(ctx, tx, orgID, now); err != nil {
			return err
		}
		before, err := scanGrant(tx.QueryRow(ctx, `SELECT `+grantCols+` FROM grants WHERE org_id = $1 AND id = $2`, orgID, grantID))
		if err != nil {
			return translate(err, fmt.Sprintf("grant %q of org %q", grantID, orgID))
		}
		if before.RevokedAt != nil || !before.Until.After(now) {
			return nil
		}
		after, err := scanGrant(tx.QueryRow(ctx, `UPDATE grants SET revoked_at = $2 WHERE id = $1 RETURNING `+grantCols, grantID, now))
		if err != nil {
			return fmt.Errorf("revoke grant %q: %w", grantID, err)
		}
		changed = true
		return audit(ctx, tx, a, orgID, "grant.revoke", "grant:"+grantID, before, after)
	})
	if err == nil && changed {
		s.changed(orgID)
	}
	return err
}

// orgGrants is what the active grants of one org add up to.
type orgGrants struct {
	units map[string]int64 // per metric
	lapse time.Time        // when the first of them lapses
}

// activeGrants sums the grants of the orgs named that are active at now, each sum
// capped at vocab.MaxUnits (1125899906842624: a numeric sum, never a bigint overflow).
func activeGrants(ctx context.Context, q querier, orgIDs []string, now time.Time) (map[string]orgGrants, error) {
	rows, err := q.Query(ctx, `SELECT org_id, metric, least(sum(units), 1125899906842624)::bigint, min(until) FROM grants
		WHERE org_id = ANY($1) AND revoked_at IS NULL AND created_at <= $2 AND until > $2
		GROUP BY org_id, metric`, orgIDs, now)
	if err != nil {
		return nil, err
	}
	out := map[string]orgGrants{}
	var org, metric string
	var units int64
	var until time.Time
	_, err = pgx.ForEachRow(rows, []any{&org, &metric, &units, &until}, func() error {
		g, ok := out[org]
		if !ok {
			g = orgGrants{units: map[string]int64{}}
		}
		g.units[metric] = units
		if g.lapse.IsZero() || until.Before(g.lapse) {
			g.lapse = until
		}
		out[org] = g
		return nil
	})
	return out, err
}

// applyGrants returns limits with each month limit raised by the units granted for
// its metric. A metric without a month limit is left alone: there is no cap to raise.
func applyGrants(limits []vocab.Limit, granted map[string]int64) []vocab.Limit {
	if len(granted) == 0 {
		return limits
	}
	out := make([]vocab.Limit, len(limits))
	for i, l := range limits {
		if l.Window == vocab.Month {
			// capped: the engine refuses a limit above vocab.MaxUnits, and a counter
			// never passes quota.MaxCounter anyway
			l.Limit = min(l.Limit+min(granted[l.Metric], vocab.MaxUnits), vocab.MaxUnits)
		}
		out[i] = l
	}
	return out
}
