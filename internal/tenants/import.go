package tenants

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// NewOrg is one org of ImportOrgs: the org with its teams and one API key, each as
// CreateOrg, CreateTeam and CreateAPIKey take it.
type NewOrg struct {
	Org   OrgInput
	Teams []TeamInput
	Key   APIKeyInput
}

// ImportedKey is the API key ImportOrgs made for one org, with its token, which is
// never shown again.
type ImportedKey struct {
	Key   APIKey
	Token string
}

// ImportChunk is how many orgs ImportOrgs writes in one transaction.
const ImportChunk = 1000

// ImportOrgs creates orgs, each with its teams and one API key, as CreateOrg, then
// CreateTeam for each of its teams in order, then CreateAPIKey would: the same
// validation, defaults, allocation rules, tokens and audit rows (one per object, so
// each org's trail reads as that of one call at a time), written with COPY, one
// transaction per ImportChunk orgs. It returns the keys in the order of orgs. (The
// key cap needs no check: a new org holds no key, and the cap is at least one.)
//
// Every input is checked before anything is written, and a refused import writes
// nothing: an invalid input is an ErrInvalid whose fields say which
// (orgs[3].teams[1].id), an id given twice (an org's, or a team's within its org)
// ErrExists, an org on a plan that does not exist ErrInvalid at orgs[i].plan, a
// team that breaks an allocation rule ErrOverAllocated. An org that exists already
// fails its chunk with ErrExists, as does anything else that fails a chunk's
// transaction: the chunks before it stay committed, and their keys are returned
// with the error.
func (s *Service) ImportOrgs(ctx context.Context, a Actor, orgs []NewOrg) ([]ImportedKey, error) {
	if err := validateImport(orgs); err != nil {
		return nil, err
	}
	plans, err := importPlans(ctx, s.pool, orgs, false)
	if err != nil {
		return nil, err
	}
	for start := 0; start < len(orgs); start += ImportChunk {
		if _, err := buildImport(ctx, s.pool, orgs[start:min(start+ImportChunk, len(orgs))], start, plans, time.Time{}); err != nil {
			return nil, err
		}
	}
	keys := make([]ImportedKey, 0, len(orgs))
	for start := 0; start < len(orgs); start += ImportChunk {
		chunk := orgs[start:min(start+ImportChunk, len(orgs))]
		ks, err := s.importChunk(ctx, a, chunk, start)
		if err != nil {
			return keys, fmt.Errorf("import orgs[%d:%d]: %w", start, start+len(chunk), err)
		}
		keys = append(keys, ks...)
		ids := make([]string, len(chunk))
		for i, o := range chunk {
			ids[i] = o.Org.ID
		}
		s.changed(ids...)
	}
	return keys, nil
}

// validateImport checks every input on its own, as the single calls' Validate do,
// and that no org id, nor team id within an org, is given twice.
func validateImport(orgs []NewOrg) error {
	seen := make(map[string]int, len(orgs))
	for i, o := range orgs {
		at := fmt.Sprintf("orgs[%d].", i)
		if err := o.Org.Validate(); err != nil {
			return fmt.Errorf("import org %q: %w", o.Org.ID, under(at, err))
		}
		if j, ok := seen[o.Org.ID]; ok {
			return fmt.Errorf("import orgs[%d] and orgs[%d]: %w", j, i, derrors.Wrap(ErrExists, "create org %q", o.Org.ID))
		}
		seen[o.Org.ID] = i
		teams := make(map[string]bool, len(o.Teams))
		for j, t := range o.Teams {
			if err := t.Validate(); err != nil {
				return fmt.Errorf("import org %q: %w", o.Org.ID, under(fmt.Sprintf("%steams[%d].", at, j), err))
			}
			if teams[t.ID] {
				return fmt.Errorf("import org %q: %w", o.Org.ID, derrors.Wrap(ErrExists, "create team %q", t.ID))
			}
			teams[t.ID] = true
		}
		if err := o.Key.Validate(); err != nil {
			return fmt.Errorf("import org %q: %w", o.Org.ID, under(at+"key.", err))
		}
	}
	return nil
}

// under names the fields of a *ValidationError or *AllocationError of one element
// of an import as that element's (prefix "orgs[3].teams[1]."); other errors are
// returned as they are.
func under(prefix string, err error) error {
	switch e := err.(type) {
	case *ValidationError:
		fs := slices.Clone(e.Fields)
		for i := range fs {
			fs[i].Field = prefix + fs[i].Field
		}
		return &ValidationError{Fields: fs}
	case *AllocationError:
		vs := slices.Clone(e.Violations)
		for i := range vs {
			vs[i].Field = prefix + vs[i].Field
		}
		return &AllocationError{Violations: vs}
	}
	return err
}

// importPlan is a plan as the allocation rules of an import read it.
type importPlan struct {
	plan    Plan
	metrics planMetrics
}

// importPlans reads the plans orgs name; a plan that does not exist is left out.
// With lock, it first takes a share lock on them, which UpdatePlan and DeletePlan
// (FOR UPDATE) wait for: the plan the rules are checked against stays the plan until
// the import's transaction ends, as an org's lock keeps it for the single calls.
func importPlans(ctx context.Context, q querier, orgs []NewOrg, lock bool) (map[string]importPlan, error) {
	var ids []string
	for _, o := range orgs {
		if !slices.Contains(ids, o.Org.PlanID) {
			ids = append(ids, o.Org.PlanID)
		}
	}
	if lock {
		slices.Sort(ids)
		if _, err := q.Exec(ctx, `SELECT 1 FROM plans WHERE id = ANY($1) ORDER BY id FOR SHARE`, ids); err != nil {
			return nil, fmt.Errorf("import orgs: lock plans: %w", err)
		}
	}
	plans := make(map[string]importPlan, len(ids))
	for _, id := range ids {
		p, err := getPlan(ctx, q, id, false)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("import orgs: %w", err)
		}
		pm, err := readPlanMetrics(ctx, q, id)
		if err != nil {
			return nil, fmt.Errorf("import orgs: %w", err)
		}
		plans[id] = importPlan{plan: p, metrics: pm}
	}
	return plans, nil
}

// importedOrg is what one NewOrg becomes: its rows and their audit snapshots.
type importedOrg struct {
	org   Org
	teams []Team
}

// buildImport makes the orgs and teams of orgs (valid inputs, the first of which is
// the import's element base) as created at now, checking the allocation rules that
// CreateOrg and CreateTeam check: the plan must exist, and each team is checked
// against its org and the teams before it, as one CreateTeam after another would be.
// q answers the money rules' messages.
func buildImport(ctx context.Context, q querier, orgs []NewOrg, base int, plans map[string]importPlan, now time.Time) ([]importedOrg, error) {
	out := make([]importedOrg, len(orgs))
	for i, o := range orgs {
		at := fmt.Sprintf("orgs[%d].", base+i)
		in := o.Org.withDefaults()
		p, ok := plans[in.PlanID]
		if !ok {
			return nil, fmt.Errorf("import org %q: %w", in.ID, under(at, noPlan(in.PlanID)))
		}
		limits := normalize(in.Limits)
		org := Org{ID: in.ID, Name: in.Name, PlanID: in.PlanID, Limits: limits, EffectiveLimits: MergeLimits(p.plan.Limits, limits),
			Mode: in.Mode, Oversubscribe: in.Oversubscribe, Leases: in.Leases, ClientLeases: in.ClientLeases, SlidingWindows: in.SlidingWindows,
			UnknownUsers: in.UnknownUsers, WebhookURL: in.WebhookURL, RedisURL: in.RedisURL, BillingAnchorDay: in.BillingAnchorDay,
			CreatedAt: now, UpdatedAt: now}
		teams := make([]Team, len(o.Teams))
		var known *MetricSet
		others := map[string]int64{} // the month limits of the teams before, per metric
		for j, tin := range o.Teams {
			t := newTeam(org.ID, tin)
			t.CreatedAt, t.UpdatedAt = now, now
			if len(t.Limits)+len(t.UserLimits) > 0 {
				if known == nil {
					k := p.metrics.of(org)
					known = &k
				}
				label := fmt.Sprintf("team %q", t.ID)
				err := allocErr(allocatedMetrics(*known, label, limitList{"limits", tin.Limits}, limitList{"user_limits", tin.UserLimits}))
				if err == nil {
					err = inMoney(ctx, q, org.PlanID, allocErr(teamViolations(org, asRequested(t, tin), others)))
				}
				if err != nil {
					return nil, fmt.Errorf("import org %q: create team %q: %w", org.ID, t.ID, under(fmt.Sprintf("%steams[%d].", at, j), err))
				}
			}
			for _, l := range t.Limits {
				if l.Window == vocab.Month {
					others[l.Metric] += l.Limit
				}
			}
			teams[j] = t
		}
		out[i] = importedOrg{org: org, teams: teams}
	}
	return out, nil
}

// importChunk writes orgs (the first of which is the import's element base) in one
// transaction.
func (s *Service) importChunk(ctx context.Context, a Actor, orgs []NewOrg, base int) ([]ImportedKey, error) {
	keys := make([]ImportedKey, len(orgs))
	ids := make([]string, len(orgs))
	for i, o := range orgs {
		id, token, err := s.newToken(o.Org.ID)
		if err != nil {
			return nil, fmt.Errorf("import org %q: create API key: %w", o.Org.ID, err)
		}
		prefix, _, _ := keyColumns(token, o.Key)
		keys[i] = ImportedKey{Key: APIKey{ID: id, OrgID: o.Org.ID, Name: o.Key.Name, Prefix: prefix, Scopes: slices.Clone(o.Key.Scopes)}, Token: token}
		ids[i] = o.Org.ID
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		plans, err := importPlans(ctx, tx, orgs, true)
		if err != nil {
			return err
		}
		var taken string
		err = tx.QueryRow(ctx, `SELECT id FROM orgs WHERE id = ANY($1) ORDER BY id LIMIT 1`, ids).Scan(&taken)
		if err == nil {
			return derrors.Wrap(ErrExists, "create org %q", taken)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		built, err := buildImport(ctx, tx, orgs, base, plans, now)
		if err != nil {
			return err
		}
		for i := range keys {
			keys[i].Key.CreatedAt = now
		}
		return writeImport(ctx, tx, a, orgs, built, keys)
	})
	if err != nil {
		return nil, err
	}
	return keys, nil
}

// writeImport copies the rows of built orgs, their teams, limits, keys and audit rows.
func writeImport(ctx context.Context, tx pgx.Tx, a Actor, orgs []NewOrg, built []importedOrg, keys []ImportedKey) error {
	copyRows := func(table string, cols []string, rows [][]any) error {
		if len(rows) == 0 {
			return nil
		}
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{table}, cols, pgx.CopyFromRows(rows)); err != nil {
			return translate(err, "import orgs: "+table)
		}
		return nil
	}
	var orgRows, orgLimits, teamRows, teamLimits, keyRows [][]any
	type auditRow struct {
		org, action, object string
		after               any
	}
	var audits []auditRow
	for i, b := range built {
		o := b.org
		orgRows = append(orgRows, []any{o.ID, o.Name, o.PlanID, string(o.Mode), o.Oversubscribe, o.WebhookURL, o.RedisURL,
			int16(o.BillingAnchorDay), string(o.Leases), string(o.SlidingWindows), string(o.UnknownUsers), string(o.ClientLeases)})
		for _, l := range o.Limits {
			orgLimits = append(orgLimits, []any{o.ID, l.Metric, string(l.Window), l.Limit, burstCol(l), l.FairShare})
		}
		audits = append(audits, auditRow{o.ID, "org.create", "org:" + o.ID, auditOrg(o)})
		for _, t := range b.teams {
			teamRows = append(teamRows, []any{o.ID, t.ID, t.Name, string(t.UnknownUsers), int32(t.Weight)})
			for _, l := range t.Limits {
				teamLimits = append(teamLimits, []any{o.ID, t.ID, "team", l.Metric, string(l.Window), l.Limit, burstCol(l)})
			}
			for _, l := range t.UserLimits {
				teamLimits = append(teamLimits, []any{o.ID, t.ID, "user_default", l.Metric, string(l.Window), l.Limit, burstCol(l)})
			}
			audits = append(audits, auditRow{o.ID, "team.create", "team:" + t.ID, t})
		}
		k := keys[i]
		prefix, digest, scopes := keyColumns(k.Token, orgs[i].Key)
		keyRows = append(keyRows, []any{k.Key.ID, o.ID, k.Key.Name, prefix, digest[:], scopes})
		audits = append(audits, auditRow{o.ID, "api_key.create", "api_key:" + k.Key.ID, k.Key})
	}
	if err := copyRows("orgs", []string{"id", "name", "plan_id", "mode", "oversubscribe", "webhook_url", "redis_url",
		"billing_anchor_day", "leases", "sliding_windows", "unknown_users", "client_leases"}, orgRows); err != nil {
		return err
	}
	if err := copyRows("org_limits", []string{"org_id", "metric", "time_window", "max_units", "burst", "fair_share"}, orgLimits); err != nil {
		return err
	}
	if err := copyRows("teams", []string{"org_id", "id", "name", "unknown_users", "weight"}, teamRows); err != nil {
		return err
	}
	if err := copyRows("team_limits", []string{"org_id", "team_id", "kind", "metric", "time_window", "max_units", "burst"}, teamLimits); err != nil {
		return err
	}
	if err := copyRows("api_keys", []string{"id", "org_id", "name", "prefix", "digest", "scopes"}, keyRows); err != nil {
		return err
	}
	// The snapshots are encoded as COPY reads them, so a chunk's JSON is never held whole.
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"audit_log"}, []string{"org_id", "actor", "action", "object", "before", "after", "request_id"},
		pgx.CopyFromSlice(len(audits), func(i int) ([]any, error) {
			r := audits[i]
			after, err := json.Marshal(r.after)
			if err != nil {
				return nil, err
			}
			return []any{r.org, a.Name, r.action, r.object, nil, after, a.RequestID}, nil
		}))
	if err != nil {
		return fmt.Errorf("import orgs: write audit rows: %w", err)
	}
	return nil
}
