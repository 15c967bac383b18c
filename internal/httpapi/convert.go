package httpapi

import (
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/redact"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Named converters between the generated wire types and the domain types.

func toLimits(in []api.Limit) []vocab.Limit {
	out := make([]vocab.Limit, len(in))
	for i, l := range in {
		out[i] = vocab.Limit{Metric: l.Metric, Window: vocab.Window(l.Window), Limit: l.Limit}
	}
	return out
}

func toLimitsPtr(in *api.Limits) *[]vocab.Limit {
	if in == nil {
		return nil
	}
	ls := toLimits(*in)
	return &ls
}

func optLimits(in *api.Limits) []vocab.Limit {
	if in == nil {
		return nil
	}
	return toLimits(*in)
}

func fromLimits(in []vocab.Limit) []api.Limit {
	out := make([]api.Limit, len(in))
	for i, l := range in {
		out[i] = api.Limit{Metric: l.Metric, Window: api.Window(l.Window), Limit: l.Limit}
	}
	return out
}

func toPricing(in *api.Pricing) *tenants.Pricing {
	if in == nil {
		return nil
	}
	p := &tenants.Pricing{Currency: in.Currency, BasePrice: in.BasePrice, Metrics: []tenants.MetricPrice{}}
	for _, m := range in.Metrics {
		p.Metrics = append(p.Metrics, tenants.MetricPrice{Metric: m.Metric, IncludedUnits: m.IncludedUnits, OveragePrice: m.OveragePrice})
	}
	return p
}

func fromPricing(in *tenants.Pricing) *api.Pricing {
	if in == nil {
		return nil
	}
	p := &api.Pricing{Currency: in.Currency, BasePrice: in.BasePrice, Metrics: []api.MetricPrice{}}
	for _, m := range in.Metrics {
		p.Metrics = append(p.Metrics, api.MetricPrice{Metric: m.Metric, IncludedUnits: m.IncludedUnits, OveragePrice: m.OveragePrice})
	}
	return p
}

func toPlanInput(in api.PlanCreate) tenants.PlanInput {
	p := tenants.PlanInput{ID: in.Id, Name: in.Name, Limits: toLimits(in.Limits),
		FailMode: vocab.FailMode(in.FailMode), Pricing: toPricing(in.Pricing)}
	if in.Metered != nil {
		p.Metered = *in.Metered
	}
	if in.Pool != nil {
		p.Pool = *in.Pool
	}
	if in.Leases != nil {
		p.Leases = tenants.Leases(*in.Leases)
	}
	if in.SlidingWindows != nil {
		p.SlidingWindows = tenants.SlidingWindows(*in.SlidingWindows)
	}
	return p
}

func toPlanPatch(in api.PlanPatch) tenants.PlanPatch {
	p := tenants.PlanPatch{Name: in.Name, Limits: toLimitsPtr(in.Limits), Metered: in.Metered, Pool: in.Pool, Pricing: toPricing(in.Pricing)}
	if in.FailMode != nil {
		fm := vocab.FailMode(*in.FailMode)
		p.FailMode = &fm
	}
	if in.Leases != nil {
		l := tenants.Leases(*in.Leases)
		p.Leases = &l
	}
	if in.SlidingWindows != nil {
		w := tenants.SlidingWindows(*in.SlidingWindows)
		p.SlidingWindows = &w
	}
	return p
}

func fromPlan(p tenants.Plan) api.Plan {
	out := api.Plan{Id: p.ID, Name: p.Name, Limits: fromLimits(p.Limits), Metered: p.Metered, FailMode: api.FailMode(p.FailMode),
		Pool: p.Pool, Pricing: fromPricing(p.Pricing), CreatedAt: p.CreatedAt, UpdatedAt: p.UpdatedAt}
	if p.Leases != "" {
		l := api.PlanLeases(p.Leases)
		out.Leases = &l
	}
	if p.SlidingWindows != "" {
		w := api.PlanSlidingWindows(p.SlidingWindows)
		out.SlidingWindows = &w
	}
	return out
}

func toOrgInput(in api.OrgCreate) tenants.OrgInput {
	o := tenants.OrgInput{ID: in.Id, Name: in.Name, PlanID: in.Plan, Limits: optLimits(in.Limits)}
	if in.Mode != nil {
		o.Mode = vocab.Mode(*in.Mode)
	}
	if in.Oversubscribe != nil {
		o.Oversubscribe = *in.Oversubscribe
	}
	if in.Leases != nil {
		o.Leases = tenants.Leases(*in.Leases)
	}
	if in.SlidingWindows != nil {
		o.SlidingWindows = tenants.SlidingWindows(*in.SlidingWindows)
	}
	if in.WebhookUrl != nil {
		o.WebhookURL = *in.WebhookUrl
	}
	if in.RedisUrl != nil {
		o.RedisURL = *in.RedisUrl
	}
	if in.BillingAnchorDay != nil {
		o.BillingAnchorDay = *in.BillingAnchorDay
	}
	return o
}

func toOrgPatch(in api.OrgPatch) tenants.OrgPatch {
	p := tenants.OrgPatch{Name: in.Name, PlanID: in.Plan, Limits: toLimitsPtr(in.Limits), Oversubscribe: in.Oversubscribe,
		WebhookURL: in.WebhookUrl, RedisURL: in.RedisUrl, BillingAnchorDay: in.BillingAnchorDay}
	if in.Mode != nil {
		m := vocab.Mode(*in.Mode)
		p.Mode = &m
	}
	if in.Leases != nil {
		l := tenants.Leases(*in.Leases)
		p.Leases = &l
	}
	if in.SlidingWindows != nil {
		w := tenants.SlidingWindows(*in.SlidingWindows)
		p.SlidingWindows = &w
	}
	return p
}

func fromOrg(o tenants.Org) api.Org {
	out := api.Org{Id: o.ID, Name: o.Name, Plan: o.PlanID, Limits: fromLimits(o.Limits),
		EffectiveLimits: fromLimits(o.EffectiveLimits), Mode: api.Mode(o.Mode), Oversubscribe: o.Oversubscribe,
		WebhookUrl: o.WebhookURL, RedisUrl: redact.URL(o.RedisURL), BillingAnchorDay: o.BillingAnchorDay,
		CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt}
	if o.Leases != "" {
		l := api.OrgLeases(o.Leases)
		out.Leases = &l
	}
	if o.SlidingWindows != "" {
		w := api.OrgSlidingWindows(o.SlidingWindows)
		out.SlidingWindows = &w
	}
	return out
}

func toTeamInput(in api.TeamCreate) tenants.TeamInput {
	return tenants.TeamInput{ID: in.Id, Name: in.Name, Limits: optLimits(in.Limits), UserLimits: optLimits(in.UserLimits)}
}

func toTeamPatch(in api.TeamPatch) tenants.TeamPatch {
	return tenants.TeamPatch{Name: in.Name, Limits: toLimitsPtr(in.Limits), UserLimits: toLimitsPtr(in.UserLimits)}
}

func fromTeam(t tenants.Team) api.Team {
	return api.Team{Id: t.ID, Org: t.OrgID, Name: t.Name, Limits: fromLimits(t.Limits), UserLimits: fromLimits(t.UserLimits),
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

func toUserInput(in api.UserCreate) tenants.UserInput {
	return tenants.UserInput{ID: in.Id, Limits: optLimits(in.Limits)}
}

func fromUser(u tenants.User) api.User {
	return api.User{Id: u.ID, Org: u.OrgID, Team: u.TeamID, Limits: fromLimits(u.Limits), CreatedAt: u.CreatedAt, UpdatedAt: u.UpdatedAt}
}

func toKeyInput(in api.ApiKeyCreate) tenants.APIKeyInput {
	k := tenants.APIKeyInput{Name: in.Name}
	for _, s := range in.Scopes {
		k.Scopes = append(k.Scopes, tenants.Scope(s))
	}
	return k
}

func fromKey(k tenants.APIKey) api.ApiKey {
	scopes := make([]api.Scope, len(k.Scopes))
	for i, s := range k.Scopes {
		scopes[i] = api.Scope(s)
	}
	return api.ApiKey{Id: k.ID, Name: k.Name, Prefix: k.Prefix, Scopes: scopes, CreatedAt: k.CreatedAt,
		LastUsedAt: k.LastUsedAt, RevokedAt: k.RevokedAt}
}

func fromConsoleUser(u tenants.ConsoleUser) api.ConsoleUser {
	return api.ConsoleUser{Id: u.ID, Email: u.Email, Role: api.ConsoleRole(u.Role), CreatedAt: u.CreatedAt}
}

func fromAudit(e tenants.AuditEntry) api.AuditEntry {
	return api.AuditEntry{Id: e.ID, Org: e.OrgID, Actor: e.Actor, Action: e.Action, Object: e.Object,
		Before: rawOrNull(e.Before), After: rawOrNull(e.After), RequestId: e.RequestID, Time: e.Time}
}

func rawOrNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

func nextPtr(c string) *string {
	if c == "" {
		return nil
	}
	return &c
}

func page(limit *int, cursor *string) tenants.Page {
	p := tenants.Page{}
	if limit != nil {
		p.Limit = *limit
	}
	if cursor != nil {
		p.Cursor = *cursor
	}
	return p
}
