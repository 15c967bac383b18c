package tenants

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// DefaultMaxOrgUsers is how many registered users ResolveOrg carries with an org: an
// org with more is resolved without them, and its user ids are looked up one by one.
const DefaultMaxOrgUsers = 20_000

// ResolvedOrg is what the check path needs of an org: its settings and effective
// limits, its plan's fail mode and pool, the metrics it knows, its teams with their
// limits and user defaults, and (up to a bound) its registered users.
type ResolvedOrg struct {
	Org      Org
	FailMode vocab.FailMode
	Pool     string
	// Leases is LeasesAuto or LeasesOff: the org's own setting, or its plan's when the
	// org follows its plan.
	Leases Leases
	// ClientLeases is LeasesAuto or LeasesOff: whether the org's clients may take
	// client leases (POST /v1/leases); the org's own setting, or its plan's when the
	// org follows its plan.
	ClientLeases Leases
	// SlidingWindows is WindowsEstimate or WindowsPrecise: the org's own setting, or
	// its plan's when the org follows its plan.
	SlidingWindows SlidingWindows
	// Weight is the org's part of a saturated capacity: its own weight, or its plan's.
	Weight  int64
	Teams   map[string]Team
	Metrics MetricSet // a check of any other metric is refused
	// Users are the org's registered users by id when UsersComplete: then an id that
	// is not in it is unregistered, known without a query. An org above the bound
	// has UsersComplete false and Users nil.
	Users         map[string]ResolvedUser
	UsersComplete bool
	// Throttles are the org's own and its plan's that had not expired when it was
	// resolved; ThrottleOf picks the one a check applies, by the check's clock.
	Throttles []Throttle
	// Entitlements are the org's resolved features (features.go): its plan's with
	// its overrides applied, served by GET /v1/entitlements from the cache.
	Entitlements Entitlements

	// Money: Currency is the plan's rate currency ("" none) and Rates the rates checks
	// are priced at, by metric (the plan's, the org's overrides in their place); nil
	// when none.
	Currency string
	Rates    map[string]Rate
}

// RouteOf is where and how the checks of org o, on plan p, run: the org's dedicated
// Redis, else its plan's pool class, with the plan's fail mode. It is the one place an
// org's route is built; the check path takes it from ResolvedOrg.Route, billing from
// the org and its plan (a zero Plan when the plan cannot be read: the default pool).
func RouteOf(o Org, p Plan) vocab.Route {
	return vocab.Route{Pool: p.Pool, RedisURL: o.RedisURL, FailMode: p.FailMode, Plan: o.PlanID}
}

// Route is the route of the resolved org: RouteOf the org and its plan's pool and fail
// mode.
func (r ResolvedOrg) Route() vocab.Route {
	return RouteOf(r.Org, Plan{Pool: r.Pool, FailMode: r.FailMode})
}

// User returns what the org snapshot knows of a user id, and whether it knows it:
// false when the org was resolved without its users (above the bound).
func (r ResolvedOrg) User(userID string) (ResolvedUser, bool) {
	if !r.UsersComplete {
		return ResolvedUser{}, false
	}
	return r.Users[userID], true
}

// ResolvedUser is a user id of an org as the check path sees it. Unregistered ids
// are valid: they get their team's user defaults.
type ResolvedUser struct {
	Registered bool
	TeamID     string
	Limits     []vocab.Limit // the user's own limits, without the team defaults
}

// ResolveOrg loads an org with everything a check needs, and its registered users
// when it has at most DefaultMaxOrgUsers.
func (s *Service) ResolveOrg(ctx context.Context, orgID string) (ResolvedOrg, error) {
	return s.ResolveOrgUsers(ctx, orgID, DefaultMaxOrgUsers)
}

// ResolveOrgUsers is ResolveOrg carrying the org's registered users when it has at
// most maxUsers of them (0: never). It is one Postgres query (resolveOrgSQL), not one
// per table: the org row joined to its plan, with its limits, its plan's, its active
// grants, its teams with their limits and user defaults, its throttles and its
// plan's, and (up to maxUsers+1) its users with their own limits, each as a JSON
// aggregate.
func (s *Service) ResolveOrgUsers(ctx context.Context, orgID string, maxUsers int) (ResolvedOrg, error) {
	var (
		org                               Org
		r                                 ResolvedOrg
		metered, priced                   []string
		over, plan, grants, teams, thr, u []byte
		features                          []byte  // entitlements: {"plan", "org"}
		rateCur                           *string // money
		rates                             []byte
	)
	err := s.pool.QueryRow(ctx, resolveOrgSQL, orgID, s.now(), maxUsers).Scan(
		&org.ID, &org.Name, &org.PlanID, &org.Mode, &org.Oversubscribe, &org.Leases, &org.ClientLeases, &org.SlidingWindows, &org.UnknownUsers, &org.WebhookURL, &org.RedisURL,
		&org.BillingAnchorDay, &org.CreatedAt, &org.UpdatedAt,
		&r.FailMode, &r.Pool, &r.Leases, &r.ClientLeases, &r.SlidingWindows, &metered, &priced, &org.Weight, &r.Weight,
		&over, &plan, &grants, &teams, &thr, &u, &features,
		&rateCur, &rates)
	if err != nil {
		return ResolvedOrg{}, translate(err, fmt.Sprintf("org %q", orgID))
	}
	if err := decodeResolved(&org, &r, over, plan, grants, teams, thr, u, maxUsers); err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: %w", orgID, err)
	}
	if err := resolvedFeatures(&r, features); err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: %w", orgID, err)
	}
	if err := decodeRates(&r, rateCur, rates); err != nil {
		return ResolvedOrg{}, fmt.Errorf("resolve org %q: %w", orgID, err)
	}
	r.Org = org
	if org.Leases != LeasesPlan && org.Leases != "" {
		r.Leases = org.Leases
	}
	if org.ClientLeases != LeasesPlan && org.ClientLeases != "" {
		r.ClientLeases = org.ClientLeases
	}
	if org.SlidingWindows != WindowsPlan && org.SlidingWindows != "" {
		r.SlidingWindows = org.SlidingWindows
	}
	r.Metrics = NewMetricSet(limitMetrics(org.EffectiveLimits), priced, metered, rateMetrics(r.Currency, mapValues(r.Rates)))
	return r, nil
}

// limitsAgg is a JSON array of the (metric, window, limit, burst, and of an org-level
// table, plan_limits or org_limits, fair_share) of the rows of table that match where,
// in vocab.Limit's JSON shape.
func limitsAgg(table, where string) string {
	shared := ""
	if table == "plan_limits" || table == "org_limits" {
		shared = `, 'fair_share', fair_share`
	}
	return `(SELECT coalesce(json_agg(json_build_object('metric', metric, 'window', time_window, 'limit', max_units, 'burst', coalesce(burst, 0)` + shared + `)), '[]')
		FROM ` + table + ` WHERE ` + where + `)`
}

// micros is a timestamptz as microseconds since the epoch, exact in JSON (a JSON
// timestamp would carry the session's time zone).
func micros(col string) string { return `(extract(epoch FROM ` + col + `) * 1000000)::bigint` }

// resolveOrgSQL resolves an org in one statement ($1 the org, $2 the service's clock,
// which grants are compared with, $3 the users carried: 0 none, else at most $3+1
// rows are read, and more than $3 means "too many"). Throttles are compared with the
// database's clock, as before.
var resolveOrgSQL = `SELECT o.id, o.name, o.plan_id, o.mode, o.oversubscribe, o.leases, o.client_leases, o.sliding_windows, o.unknown_users, o.webhook_url, o.redis_url,
	o.billing_anchor_day, o.created_at, o.updated_at,
	p.fail_mode, p.pool, p.leases, p.client_leases, p.sliding_windows, p.metered, ARRAY(SELECT metric FROM plan_prices WHERE plan_id = p.id),
	coalesce(o.weight, 0), coalesce(o.weight, p.weight),
	` + limitsAgg("org_limits", "org_id = o.id") + `,
	` + limitsAgg("plan_limits", "plan_id = o.plan_id") + `,
	(SELECT coalesce(json_agg(json_build_object('metric', metric, 'units', units, 'until', ` + micros("until") + `)), '[]')
		FROM (SELECT metric, least(sum(units), 1125899906842624)::bigint AS units, min(until) AS until FROM grants
			WHERE org_id = o.id AND revoked_at IS NULL AND created_at <= $2 AND until > $2 GROUP BY metric) g),
	(SELECT coalesce(json_agg(json_build_object('id', t.id, 'name', t.name, 'unknown_users', t.unknown_users, 'weight', t.weight,
			'created_at', ` + micros("t.created_at") + `, 'updated_at', ` + micros("t.updated_at") + `,
			'limits', ` + limitsAgg("team_limits", "org_id = t.org_id AND team_id = t.id AND kind = 'team'") + `,
			'user_limits', ` + limitsAgg("team_limits", "org_id = t.org_id AND team_id = t.id AND kind = 'user_default'") + `)), '[]')
		FROM teams t WHERE t.org_id = o.id),
	(SELECT coalesce(json_agg(json_build_object('scope', CASE WHEN org_id IS NULL THEN 'plan' ELSE 'org' END, 'id', coalesce(org_id, plan_id),
			'ppm', factor_ppm, 'month', month, 'reason', reason, 'expires_at', ` + micros("expires_at") + `,
			'created_at', ` + micros("created_at") + `, 'created_by', created_by) ORDER BY org_id NULLS LAST), '[]')
		FROM throttles WHERE (org_id = o.id OR plan_id = o.plan_id) AND expires_at > now()),
	CASE WHEN $3::int > 0 THEN (SELECT coalesce(json_agg(json_build_object('id', u.id, 'team', u.team_id,
			'limits', ` + limitsAgg("user_limits", "org_id = u.org_id AND user_id = u.id") + `)), '[]')
		FROM (SELECT org_id, id, team_id FROM users WHERE org_id = o.id LIMIT $3::int + 1) u) END,
	json_build_object('plan', p.features, 'org', o.feature_overrides),
	` + resolvedRatesSQL + `
	FROM orgs o JOIN plans p ON p.id = o.plan_id WHERE o.id = $1`

// decodeResolved fills org and r from the JSON aggregates of resolveOrgSQL, as
// getOrg, fillTeams, resolveThrottles and orgUsers fill them from their queries.
func decodeResolved(org *Org, r *ResolvedOrg, over, plan, grants, teams, thr, users []byte, maxUsers int) error {
	var ol, pl []vocab.Limit
	var gs []struct {
		Metric string `json:"metric"`
		Units  int64  `json:"units"`
		Until  int64  `json:"until"`
	}
	var ts []struct {
		ID           string        `json:"id"`
		Name         string        `json:"name"`
		UnknownUsers UnknownUsers  `json:"unknown_users"`
		Weight       int64         `json:"weight"`
		CreatedAt    int64         `json:"created_at"`
		UpdatedAt    int64         `json:"updated_at"`
		Limits       []vocab.Limit `json:"limits"`
		UserLimits   []vocab.Limit `json:"user_limits"`
	}
	var ths []struct {
		Scope     ThrottleScope `json:"scope"`
		ID        string        `json:"id"`
		PPM       int64         `json:"ppm"`
		Month     bool          `json:"month"`
		Reason    string        `json:"reason"`
		ExpiresAt int64         `json:"expires_at"`
		CreatedAt int64         `json:"created_at"`
		CreatedBy string        `json:"created_by"`
	}
	var us []struct {
		ID     string        `json:"id"`
		Team   string        `json:"team"`
		Limits []vocab.Limit `json:"limits"`
	}
	for _, d := range []struct {
		raw []byte
		v   any
	}{{over, &ol}, {plan, &pl}, {grants, &gs}, {teams, &ts}, {thr, &ths}, {users, &us}} {
		if d.raw == nil {
			continue
		}
		if err := json.Unmarshal(d.raw, d.v); err != nil {
			return err
		}
	}
	org.Limits = normalize(ol)
	org.EffectiveLimits = MergeLimits(normalize(pl), org.Limits)
	if len(gs) > 0 {
		units := make(map[string]int64, len(gs))
		var lapse time.Time
		for _, g := range gs {
			units[g.Metric] = g.Units
			if until := time.UnixMicro(g.Until); lapse.IsZero() || until.Before(lapse) {
				lapse = until
			}
		}
		org.Granted, org.GrantsLapse = units, lapse
		org.EffectiveLimits = applyGrants(org.EffectiveLimits, units)
	}
	r.Teams = make(map[string]Team, len(ts))
	for _, t := range ts {
		r.Teams[t.ID] = Team{OrgID: org.ID, ID: t.ID, Name: t.Name, Limits: normalize(t.Limits), UserLimits: normalize(t.UserLimits),
			UnknownUsers: t.UnknownUsers, Weight: t.Weight, CreatedAt: time.UnixMicro(t.CreatedAt), UpdatedAt: time.UnixMicro(t.UpdatedAt)}
	}
	for _, t := range ths {
		r.Throttles = append(r.Throttles, Throttle{Scope: t.Scope, ID: t.ID, PPM: t.PPM, Month: t.Month, Reason: t.Reason,
			ExpiresAt: time.UnixMicro(t.ExpiresAt), CreatedAt: time.UnixMicro(t.CreatedAt), CreatedBy: t.CreatedBy})
	}
	if maxUsers > 0 && len(us) <= maxUsers {
		r.Users = make(map[string]ResolvedUser, len(us))
		for _, u := range us {
			r.Users[u.ID] = ResolvedUser{Registered: true, TeamID: u.Team, Limits: userLimits(u.Limits)}
		}
		r.UsersComplete = true
	}
	return nil
}

// userLimits is a user's own limits as orgUsers gave them: normalized, nil when none.
func userLimits(ls []vocab.Limit) []vocab.Limit {
	if len(ls) == 0 {
		return nil
	}
	return normalize(ls)
}

// ResolveUser looks a user id of an org up, with its own limits, in one query; an
// unregistered id is not an error.
func (s *Service) ResolveUser(ctx context.Context, orgID, userID string) (ResolvedUser, error) {
	var u ResolvedUser
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT u.team_id, `+limitsAgg("user_limits", "org_id = u.org_id AND user_id = u.id")+`
		FROM users u WHERE u.org_id = $1 AND u.id = $2`, orgID, userID).Scan(&u.TeamID, &raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return ResolvedUser{}, nil
	}
	if err != nil {
		return ResolvedUser{}, fmt.Errorf("resolve user %q: %w", userID, err)
	}
	if err := json.Unmarshal(raw, &u.Limits); err != nil {
		return ResolvedUser{}, fmt.Errorf("resolve user %q: %w", userID, err)
	}
	u.Registered, u.Limits = true, normalize(u.Limits)
	return u, nil
}

// ResolveUsers looks up user ids of an org, with their own limits, in one query: ids
// that are not registered map to the zero ResolvedUser.
func (s *Service) ResolveUsers(ctx context.Context, orgID string, userIDs []string) (map[string]ResolvedUser, error) {
	rows, err := s.pool.Query(ctx, `SELECT u.id, u.team_id, `+limitsAgg("user_limits", "org_id = u.org_id AND user_id = u.id")+`
		FROM users u WHERE u.org_id = $1 AND u.id = ANY($2)`, orgID, userIDs)
	if err != nil {
		return nil, fmt.Errorf("resolve users of org %q: %w", orgID, err)
	}
	out := make(map[string]ResolvedUser, len(userIDs))
	for _, id := range userIDs {
		out[id] = ResolvedUser{}
	}
	var id, team string
	var raw []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &team, &raw}, func() error {
		u := ResolvedUser{Registered: true, TeamID: team}
		if err := json.Unmarshal(raw, &u.Limits); err != nil {
			return err
		}
		u.Limits = normalize(u.Limits)
		out[id] = u
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("resolve users of org %q: %w", orgID, err)
	}
	return out, nil
}
