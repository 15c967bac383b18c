package tenants

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/platform/redact"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

const orgCols = `id, name, plan_id, mode, oversubscribe, leases, client_leases, sliding_windows, unknown_users, webhook_url, redis_url, billing_anchor_day, created_at, updated_at, coalesce(weight, 0)`

func scanOrg(row pgx.Row) (Org, error) {
	var o Org
	err := row.Scan(&o.ID, &o.Name, &o.PlanID, &o.Mode, &o.Oversubscribe, &o.Leases, &o.ClientLeases, &o.SlidingWindows, &o.UnknownUsers, &o.WebhookURL, &o.RedisURL,
		&o.BillingAnchorDay, &o.CreatedAt, &o.UpdatedAt, &o.Weight)
	return o, err
}

// fillOrgs loads the overrides and effective limits of the orgs given, the month
// limits raised by the grants active at now (see applyGrants).
func fillOrgs(ctx context.Context, q querier, orgs []Org, now time.Time) error {
	if len(orgs) == 0 {
		return nil
	}
	ids := make([]string, len(orgs))
	planIDs := make([]string, len(orgs))
	for i, o := range orgs {
		ids[i], planIDs[i] = o.ID, o.PlanID
	}
	over, err := limitsOf(ctx, q, `SELECT org_id, `+limitCols+` FROM org_limits WHERE org_id = ANY($1)`, ids)
	if err != nil {
		return err
	}
	plan, err := limitsOf(ctx, q, `SELECT plan_id, `+limitCols+` FROM plan_limits WHERE plan_id = ANY($1)`, planIDs)
	if err != nil {
		return err
	}
	granted, err := activeGrants(ctx, q, ids, now)
	if err != nil {
		return err
	}
	for i := range orgs {
		orgs[i].Limits = normalize(over[orgs[i].ID])
		orgs[i].EffectiveLimits = MergeLimits(plan[orgs[i].PlanID], orgs[i].Limits)
		if g, ok := granted[orgs[i].ID]; ok {
			orgs[i].Granted, orgs[i].GrantsLapse = g.units, g.lapse
			orgs[i].EffectiveLimits = applyGrants(orgs[i].EffectiveLimits, g.units)
		}
	}
	return nil
}

func getOrg(ctx context.Context, q querier, id string, now time.Time) (Org, error) {
	o, err := scanOrg(q.QueryRow(ctx, `SELECT `+orgCols+` FROM orgs WHERE id = $1`, id))
	if err != nil {
		return Org{}, translate(err, fmt.Sprintf("org %q", id))
	}
	os := []Org{o}
	if err := fillOrgs(ctx, q, os, now); err != nil {
		return Org{}, fmt.Errorf("org %q: %w", id, err)
	}
	return os[0], nil
}

// auditOrg is the snapshot of an org the audit log keeps: no Redis password, and no
// credentials of its webhook URL.
func auditOrg(o Org) Org {
	o.RedisURL = redact.URL(o.RedisURL)
	o.WebhookURL = redact.WebhookURL(o.WebhookURL)
	return o
}

// teamAggregate summarizes the teams' own limits of an org.
func teamAggregate(ctx context.Context, q querier, orgID string) (childAggregate, error) {
	agg := newChildAggregate()
	rows, err := q.Query(ctx, `SELECT team_id, metric, time_window, max_units, coalesce(burst, 0) FROM team_limits
		WHERE org_id = $1 AND kind = 'team'`, orgID)
	if err != nil {
		return agg, err
	}
	var owner string
	var l vocab.Limit
	_, err = pgx.ForEachRow(rows, []any{&owner, &l.Metric, &l.Window, &l.Limit, &l.Burst}, func() error {
		agg.add(owner, l)
		return nil
	})
	return agg, err
}

// checkOrgCoversTeams reports the effective limits of an org that its teams' current
// allocations no longer fit under.
func checkOrgCoversTeams(ctx context.Context, q querier, orgID string, effective []vocab.Limit, oversubscribe bool) ([]Violation, error) {
	agg, err := teamAggregate(ctx, q, orgID)
	if err != nil {
		return nil, err
	}
	return parentCoversChildren("limits", effective, fmt.Sprintf("org %q", orgID), "team", agg, oversubscribe), nil
}

// CreateOrg creates an org on an existing plan.
func (s *Service) CreateOrg(ctx context.Context, a Actor, in OrgInput) (Org, error) {
	if err := in.Validate(); err != nil {
		return Org{}, err
	}
	in = in.withDefaults()
	var out Org
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := getPlan(ctx, tx, in.PlanID, false); err != nil {
			return noPlan(in.PlanID)
		}
		_, err := tx.Exec(ctx, `INSERT INTO orgs (id, name, plan_id, mode, oversubscribe, webhook_url, redis_url, billing_anchor_day, leases, sliding_windows, unknown_users, client_leases)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`, in.ID, in.Name, in.PlanID, in.Mode, in.Oversubscribe,
			in.WebhookURL, in.RedisURL, in.BillingAnchorDay, in.Leases, in.SlidingWindows, in.UnknownUsers, in.ClientLeases)
		if err != nil {
			return translate(err, fmt.Sprintf("create org %q", in.ID))
		}
		if err := writeOrgLimits(ctx, tx, in.ID, normalize(in.Limits)); err != nil {
			return fmt.Errorf("create org %q: %w", in.ID, err)
		}
		if out, err = getOrg(ctx, tx, in.ID, s.now()); err != nil {
			return err
		}
		return audit(ctx, tx, a, in.ID, "org.create", "org:"+in.ID, nil, auditOrg(out))
	})
	if err == nil {
		s.changed(in.ID)
	}
	return out, err
}

// withDefaults fills in the settings a new org left unset.
func (in OrgInput) withDefaults() OrgInput {
	if in.Leases == "" {
		in.Leases = LeasesPlan
	}
	if in.ClientLeases == "" {
		in.ClientLeases = LeasesPlan
	}
	if in.SlidingWindows == "" {
		in.SlidingWindows = WindowsPlan
	}
	if in.UnknownUsers == "" {
		in.UnknownUsers = UnknownUsersAllow
	}
	if in.Mode == "" {
		in.Mode = vocab.Enforce
	}
	if in.BillingAnchorDay == 0 {
		in.BillingAnchorDay = 1
	}
	return in
}

// noPlan refuses an org on a plan that does not exist.
func noPlan(id string) error {
	return &ValidationError{Fields: []FieldError{{Field: "plan", Message: fmt.Sprintf("no plan with id %q", id)}}}
}

func writeOrgLimits(ctx context.Context, tx pgx.Tx, orgID string, ls []vocab.Limit) error {
	return replaceLimits(ctx, tx, `DELETE FROM org_limits WHERE org_id = $1`, []any{orgID},
		`INSERT INTO org_limits (org_id, metric, time_window, max_units, burst, fair_share)
		 SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::boolean[])`, ls, true)
}

// GetOrg returns the org with id, with its effective limits.
func (s *Service) GetOrg(ctx context.Context, id string) (Org, error) {
	return getOrg(ctx, s.pool, id, s.now())
}

// ListOrgs returns one page of orgs ordered by id.
func (s *Service) ListOrgs(ctx context.Context, page Page) ([]Org, string, error) {
	orgs, next, err := listPage(ctx, s.pool, "orgs", page, `SELECT `+orgCols+` FROM orgs WHERE id > $1 ORDER BY id LIMIT $2`,
		scanOrg, func(o Org) string { return o.ID })
	if err == nil {
		err = fillOrgs(ctx, s.pool, orgs, s.now())
	}
	return orgs, next, err
}

// UpdateOrg changes an org. A new plan, new overrides or turning oversubscription off
// are checked against the org's teams: refused with ErrOverAllocated when the teams'
// allocations would no longer fit. Authorization of operator-only fields is the
// caller's (see OrgPatch.OperatorOnly).
func (s *Service) UpdateOrg(ctx context.Context, a Actor, id string, patch OrgPatch) (Org, error) {
	if err := patch.Validate(); err != nil {
		return Org{}, err
	}
	var out Org
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		before, err := lockOrg(ctx, tx, id, s.now())
		if err != nil {
			return err
		}
		after := before
		if patch.Name != nil {
			after.Name = *patch.Name
		}
		if patch.Mode != nil {
			after.Mode = *patch.Mode
		}
		if patch.Oversubscribe != nil {
			after.Oversubscribe = *patch.Oversubscribe
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
		if patch.UnknownUsers != nil {
			after.UnknownUsers = *patch.UnknownUsers
		}
		if patch.WebhookURL != nil {
			after.WebhookURL = *patch.WebhookURL
		}
		if patch.RedisURL != nil {
			after.RedisURL = *patch.RedisURL
		}
		if patch.BillingAnchorDay != nil {
			after.BillingAnchorDay = *patch.BillingAnchorDay
		}
		if patch.Weight != nil {
			after.Weight = *patch.Weight
		}
		if patch.RemoveWeight {
			after.Weight = 0
		}
		if patch.Limits != nil {
			after.Limits = normalize(*patch.Limits)
		}
		if patch.PlanID != nil {
			after.PlanID = *patch.PlanID
		}
		if patch.PlanID != nil || patch.Limits != nil || patch.Oversubscribe != nil {
			plan, err := getPlan(ctx, tx, after.PlanID, false)
			if err != nil {
				return noPlan(after.PlanID)
			}
			eff := applyGrants(MergeLimits(plan.Limits, after.Limits), before.Granted)
			vs, err := checkOrgCoversTeams(ctx, tx, id, eff, after.Oversubscribe)
			if err != nil {
				return err
			}
			fallback := "oversubscribe"
			if patch.PlanID != nil {
				fallback = "plan"
			}
			var req []vocab.Limit
			if patch.Limits != nil {
				req = *patch.Limits
			}
			vs = fieldFor(vs, "limits", req, fallback)
			if patch.PlanID != nil || patch.Limits != nil {
				field := "plan"
				if patch.PlanID == nil {
					field = "limits"
				}
				forgot, err := forgottenMetrics(ctx, tx, id, planKnows(plan, after.Limits), field)
				if err != nil {
					return err
				}
				vs = append(vs, forgot...)
			}
			if err := inMoney(ctx, tx, after.PlanID, allocErr(vs)); err != nil {
				return fmt.Errorf("update org %q: %w", id, err)
			}
		}
		_, err = tx.Exec(ctx, `UPDATE orgs SET name = $2, plan_id = $3, mode = $4, oversubscribe = $5, webhook_url = $6,
			redis_url = $7, billing_anchor_day = $8, leases = $9, sliding_windows = $10, unknown_users = $11, weight = nullif($12, 0),
			client_leases = $13, updated_at = now() WHERE id = $1`,
			id, after.Name, after.PlanID, after.Mode, after.Oversubscribe, after.WebhookURL, after.RedisURL, after.BillingAnchorDay, after.Leases,
			after.SlidingWindows, after.UnknownUsers, after.Weight, after.ClientLeases)
		if err != nil {
			return fmt.Errorf("update org %q: %w", id, err)
		}
		if patch.Limits != nil {
			if err := writeOrgLimits(ctx, tx, id, after.Limits); err != nil {
				return fmt.Errorf("update org %q: %w", id, err)
			}
		}
		if out, err = getOrg(ctx, tx, id, s.now()); err != nil {
			return err
		}
		return audit(ctx, tx, a, id, "org.update", "org:"+id, auditOrg(before), auditOrg(out))
	})
	if err == nil {
		s.changed(id)
	}
	return out, err
}

// OrgRoutes returns the orgs of ids that exist, without their limits: what the
// worker's flush needs to reach an org's counters (plan, Redis, billing anchor), in
// one query however many, for the flush visits only orgs with new usage.
func (s *Service) OrgRoutes(ctx context.Context, ids []string) ([]Org, error) {
	return orgRows(ctx, s, `SELECT `+orgCols+` FROM orgs WHERE id = ANY($1)`, ids)
}

// DedicatedOrgs returns the orgs with a Redis of their own, without their limits:
// the worker opens their Redis to pop its dirty-org index.
func (s *Service) DedicatedOrgs(ctx context.Context) ([]Org, error) {
	return orgRows(ctx, s, `SELECT `+orgCols+` FROM orgs WHERE redis_url <> ''`)
}

func orgRows(ctx context.Context, s *Service, q string, args ...any) ([]Org, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list orgs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Org, error) { return scanOrg(r) })
	if err != nil {
		return nil, fmt.Errorf("list orgs: %w", err)
	}
	return out, nil
}
