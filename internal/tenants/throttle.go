package tenants

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// ThrottleScope says what a throttle covers: one org, or every org of a plan.
type ThrottleScope string

// The scopes of a throttle.
const (
	ThrottleOrg  ThrottleScope = "org"
	ThrottlePlan ThrottleScope = "plan"
)

// FactorUnit is what a factor of 1 is in Throttle.PPM: factors are kept to six
// decimal places, so a throttled limit is computed in integers, exactly.
const FactorUnit = 1_000_000

// MaxThrottleTTL is how far ahead a throttle may expire: it is a reaction to a
// moment of stress, not a plan change.
const MaxThrottleTTL = 7 * 24 * time.Hour

// Throttle multiplies every sliding-window limit of its scope (and the month limit
// when Month) by PPM/FactorUnit until ExpiresAt.
type Throttle struct {
	Scope     ThrottleScope `json:"scope"`
	ID        string        `json:"id"` // the org's or the plan's
	PPM       int64         `json:"factor_ppm"`
	Month     bool          `json:"month"`
	Reason    string        `json:"reason"`
	ExpiresAt time.Time     `json:"expires_at"`
	CreatedAt time.Time     `json:"created_at"`
	CreatedBy string        `json:"created_by"`
}

// Factor is PPM as a fraction of 1.
func (t Throttle) Factor() float64 { return float64(t.PPM) / FactorUnit }

// Active reports whether the throttle applies at now.
func (t Throttle) Active(now time.Time) bool { return t.PPM > 0 && now.Before(t.ExpiresAt) }

// Apply returns limit throttled: floor(limit * factor), at least 0. A month limit
// is throttled only when t.Month. The zero Throttle returns limit unchanged.
func (t Throttle) Apply(w vocab.Window, limit int64) int64 {
	if t.PPM <= 0 || t.PPM >= FactorUnit || limit <= 0 || (w == vocab.Month && !t.Month) {
		return limit
	}
	hi, lo := bits.Mul64(uint64(limit), uint64(t.PPM))
	q, _ := bits.Div64(hi, lo, FactorUnit) // hi < FactorUnit: limit < 2^63, PPM < 10^6
	return int64(q)
}

// DefaultThrottleTTL is how long a throttle set with neither an expiry nor a TTL lasts.
const DefaultThrottleTTL = time.Hour

// ThrottleInput sets a throttle. At most one of ExpiresAt and TTLSeconds is given;
// with neither, the throttle lasts DefaultThrottleTTL.
type ThrottleInput struct {
	Factor     float64
	ExpiresAt  *time.Time
	TTLSeconds *int64
	Reason     string
	Month      bool
}

// validate checks the input against now, and returns the factor in millionths and
// the expiry.
func (in ThrottleInput) validate(now time.Time) (int64, time.Time, error) {
	var errs fieldErrs
	ppm := int64(math.Round(in.Factor * FactorUnit))
	if math.IsNaN(in.Factor) || in.Factor <= 0 || in.Factor > 1 || ppm <= 0 {
		errs.add("factor", "must be greater than 0 and at most 1 (kept to 6 decimal places)")
	}
	var exp time.Time
	switch {
	case in.ExpiresAt != nil && in.TTLSeconds != nil:
		errs.add("expires_at", "give expires_at or ttl_seconds, not both")
	case in.ExpiresAt == nil && in.TTLSeconds == nil:
		exp = now.Add(DefaultThrottleTTL)
	case in.TTLSeconds != nil:
		if *in.TTLSeconds < 1 || *in.TTLSeconds > int64(MaxThrottleTTL/time.Second) {
			errs.add("ttl_seconds", "must be 1 to %d (7 days)", int64(MaxThrottleTTL/time.Second))
		} else {
			exp = now.Add(time.Duration(*in.TTLSeconds) * time.Second)
		}
	default:
		exp = *in.ExpiresAt
		if !exp.After(now) {
			errs.add("expires_at", "must be in the future")
		} else if exp.Sub(now) > MaxThrottleTTL {
			errs.add("expires_at", "must be at most 7 days ahead")
		}
	}
	if n := len([]rune(in.Reason)); n < 1 || n > 500 || strings.TrimSpace(in.Reason) == "" {
		errs.add("reason", "must be 1 to 500 characters: say why, for the audit log and the console")
	}
	return ppm, exp.UTC().Truncate(time.Microsecond), errs.err()
}

const throttleCols = `factor_ppm, month, reason, expires_at, created_at, created_by`

func throttleWhere(scope ThrottleScope) string {
	if scope == ThrottlePlan {
		return `plan_id = $1`
	}
	return `org_id = $1`
}

func getThrottle(ctx context.Context, q querier, scope ThrottleScope, id string) (Throttle, error) {
	t := Throttle{Scope: scope, ID: id}
	err := q.QueryRow(ctx, `SELECT `+throttleCols+` FROM throttles WHERE `+throttleWhere(scope), id).
		Scan(&t.PPM, &t.Month, &t.Reason, &t.ExpiresAt, &t.CreatedAt, &t.CreatedBy)
	if err != nil {
		return Throttle{}, translate(err, fmt.Sprintf("throttle of %s %q", scope, id))
	}
	return t, nil
}

// lockThrottleOwner takes the row lock of the org or plan a throttle is for, and
// returns the orgs whose checks it governs.
func lockThrottleOwner(ctx context.Context, tx pgx.Tx, scope ThrottleScope, id string, now time.Time) (auditOrg string, orgIDs []string, err error) {
	if scope == ThrottleOrg {
		if _, err := lockOrg(ctx, tx, id, now); err != nil {
			return "", nil, err
		}
		return id, []string{id}, nil
	}
	var pid string
	if err := tx.QueryRow(ctx, `SELECT id FROM plans WHERE id = $1 FOR UPDATE`, id).Scan(&pid); err != nil {
		return "", nil, translate(err, fmt.Sprintf("plan %q", id))
	}
	rows, err := tx.Query(ctx, `SELECT id FROM orgs WHERE plan_id = $1 ORDER BY id`, id)
	if err != nil {
		return "", nil, err
	}
	orgIDs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return "", orgIDs, err
}

// SetThrottle sets (or replaces) the throttle of an org or a plan; every replica
// applies it within a moment, and it lifts by itself at its expiry. Errors:
// *ValidationError, ErrNotFound (no such org or plan).
func (s *Service) SetThrottle(ctx context.Context, a Actor, scope ThrottleScope, id string, in ThrottleInput) (Throttle, error) {
	ppm, exp, err := in.validate(s.now())
	if err != nil {
		return Throttle{}, err
	}
	var out Throttle
	var orgIDs []string
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		auditOrg, ids, err := lockThrottleOwner(ctx, tx, scope, id, s.now())
		if err != nil {
			return err
		}
		orgIDs = ids
		var before any
		if b, err := getThrottle(ctx, tx, scope, id); err == nil {
			before = b
		} else if !errors.Is(err, ErrNotFound) {
			return err
		}
		var orgID, planID *string
		if scope == ThrottlePlan {
			planID = &id
		} else {
			orgID = &id
		}
		if _, err := tx.Exec(ctx, `DELETE FROM throttles WHERE `+throttleWhere(scope), id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO throttles (org_id, plan_id, factor_ppm, month, reason, expires_at, created_by)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, orgID, planID, ppm, in.Month, in.Reason, exp, a.Name)
		if err != nil {
			return fmt.Errorf("set throttle of %s %q: %w", scope, id, err)
		}
		if out, err = getThrottle(ctx, tx, scope, id); err != nil {
			return err
		}
		return audit(ctx, tx, a, auditOrg, "throttle.set", string(scope)+":"+id, before, out)
	})
	if err != nil {
		return Throttle{}, err
	}
	s.changed(orgIDs...)
	return out, nil
}

// GetThrottle returns the throttle of an org or a plan, and false when it has none in
// force (none set, or expired). Errors: ErrNotFound when the org or plan does not exist.
func (s *Service) GetThrottle(ctx context.Context, scope ThrottleScope, id string) (Throttle, bool, error) {
	if err := throttleOwnerExists(ctx, s.pool, scope, id); err != nil {
		return Throttle{}, false, err
	}
	t, err := getThrottle(ctx, s.pool, scope, id)
	if errors.Is(err, ErrNotFound) || (err == nil && !t.Active(s.now())) {
		return Throttle{}, false, nil
	}
	return t, err == nil, err
}

// throttleOwnerExists answers ErrNotFound when the org or plan does not exist.
func throttleOwnerExists(ctx context.Context, q querier, scope ThrottleScope, id string) error {
	table := "orgs"
	if scope == ThrottlePlan {
		table = "plans"
	}
	var one int
	err := q.QueryRow(ctx, `SELECT 1 FROM `+table+` WHERE id = $1`, id).Scan(&one)
	return translate(err, fmt.Sprintf("%s %q", scope, id))
}

// DeleteThrottle lifts the throttle of an org or a plan at once. Errors: ErrNotFound
// when there is none (an expired one is deleted all the same).
func (s *Service) DeleteThrottle(ctx context.Context, a Actor, scope ThrottleScope, id string) error {
	var orgIDs []string
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		auditOrg, ids, err := lockThrottleOwner(ctx, tx, scope, id, s.now())
		if err != nil {
			return err
		}
		orgIDs = ids
		before, err := getThrottle(ctx, tx, scope, id)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM throttles WHERE `+throttleWhere(scope), id); err != nil {
			return err
		}
		return audit(ctx, tx, a, auditOrg, "throttle.delete", string(scope)+":"+id, before, nil)
	})
	if err != nil {
		return err
	}
	s.changed(orgIDs...)
	return nil
}

// ThrottleOf returns the throttle of the org's checks at now: of the org's own and
// its plan's, the active one with the smaller factor (the org's on a tie), so an org
// admin cannot loosen what the operator set on the plan. ok is false when neither
// applies.
func (r ResolvedOrg) ThrottleOf(now time.Time) (t Throttle, ok bool) {
	for _, c := range r.Throttles {
		if c.Active(now) && (!ok || c.PPM < t.PPM) {
			t, ok = c, true
		}
	}
	return t, ok
}

// resolveThrottles loads the org's throttle and its plan's that have not expired.
func resolveThrottles(ctx context.Context, q querier, orgID, planID string) ([]Throttle, error) {
	rows, err := q.Query(ctx, `SELECT CASE WHEN org_id IS NULL THEN 'plan' ELSE 'org' END, coalesce(org_id, plan_id), `+throttleCols+`
		FROM throttles WHERE (org_id = $1 OR plan_id = $2) AND expires_at > now() ORDER BY org_id NULLS LAST`, orgID, planID)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Throttle, error) {
		var t Throttle
		err := r.Scan(&t.Scope, &t.ID, &t.PPM, &t.Month, &t.Reason, &t.ExpiresAt, &t.CreatedAt, &t.CreatedBy)
		return t, err
	})
}

// ThrottleInForce returns the throttle the org's checks apply now, as ThrottleOf
// picks it, and false when none applies. Errors: ErrNotFound when the org does not
// exist.
func (s *Service) ThrottleInForce(ctx context.Context, orgID string) (Throttle, bool, error) {
	org, err := getOrg(ctx, s.pool, orgID, s.now())
	if err != nil {
		return Throttle{}, false, err
	}
	ts, err := resolveThrottles(ctx, s.pool, orgID, org.PlanID)
	if err != nil {
		return Throttle{}, false, fmt.Errorf("throttle of org %q: %w", orgID, err)
	}
	t, ok := ResolvedOrg{Throttles: ts}.ThrottleOf(s.now())
	return t, ok, nil
}
