package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/redact"
	"github.com/quotaplane/quotaplane/internal/platform/redisconn"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Orgs: created and listed by the operator, read and changed by their admins.

// CreateOrg handles POST /v1/orgs (operator).
func (s *Server) CreateOrg(w http.ResponseWriter, r *http.Request) {
	handle(s, w, r, http.StatusCreated, fromOrg, func(in api.OrgCreate) (tenants.Org, error) {
		o := toOrgInput(in)
		if o.Validate() == nil && (in.RedisUrlCheck == nil || *in.RedisUrlCheck) {
			if err := reachRedis(r.Context(), o.RedisURL); err != nil {
				return tenants.Org{}, err
			}
		}
		return s.tenants.CreateOrg(r.Context(), actor(r), o)
	})
}

// redisCheckWait bounds the check of an org's redis_url.
var redisCheckWait = 3 * time.Second

// reachRedis checks, when an org's redis_url is set, that a Redis answers there: the
// worker would warn about an unreachable one several times a second, forever. It
// answers 422 naming the field, with what went wrong in the API's words and the
// override for a Redis that comes later ("redis_url_check": false). A URL that does
// not parse is left to the validation's 400.
func reachRedis(ctx context.Context, raw string) error {
	if raw == "" {
		return nil
	}
	o, err := redisconn.Parse(raw, false)
	if err != nil {
		return nil
	}
	if opt := o.Single; opt != nil {
		opt.MaxRetries, opt.DialerRetries = -1, 1
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = redisCheckWait, redisCheckWait, redisCheckWait
	}
	if opt := o.Cluster; opt != nil {
		opt.MaxRetries, opt.DialerRetries = -1, 1
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout = redisCheckWait, redisCheckWait, redisCheckWait
	}
	c := o.Client()
	defer c.Close()
	pctx, cancel := context.WithTimeout(ctx, redisCheckWait)
	defer cancel()
	err = c.Ping(pctx).Err()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	why := redisFailure(err)
	msg := fmt.Sprintf("cannot reach Redis at %s (%s); fix redis_url, or, for a Redis that comes later, send \"redis_url_check\": false to store it anyway",
		redact.URL(raw), why)
	return derrors.E(derrors.Unprocessable, "redis_url: "+msg, nil,
		derrors.FieldError{Field: "redis_url", Message: msg})
}

// redisFailure says in the API's words why a Redis did not answer.
func redisFailure(err error) string {
	var dnsErr *net.DNSError
	var ne net.Error
	text := err.Error()
	switch {
	case errors.As(err, &dnsErr):
		return "DNS lookup failed for " + dnsErr.Name
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no answer within %g s", redisCheckWait.Seconds())
	case strings.Contains(text, "NOAUTH"), strings.Contains(text, "WRONGPASS"), strings.Contains(text, "invalid password"):
		return "authentication failed: check the user and password of the URL"
	case strings.Contains(text, "tls:"), strings.Contains(text, "x509:"):
		return "TLS handshake failed"
	}
	return "no Redis answered"
}

// ListOrgs handles GET /v1/orgs (operator).
func (s *Server) ListOrgs(w http.ResponseWriter, r *http.Request, params api.ListOrgsParams) {
	os, next, err := s.tenants.ListOrgs(r.Context(), page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.OrgList{Items: mapSlice(os, fromOrg), NextCursor: nextPtr(next)})
}

// GetOrg handles GET /v1/orgs/{org}.
func (s *Server) GetOrg(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	o, err := s.tenants.GetOrg(r.Context(), org)
	if c := callerOf(r).console; c != nil && !c.CanChange() {
		o.WebhookURL = redact.WebhookURL(o.WebhookURL) // a viewer sees no credentials
	}
	respond(s, w, r, http.StatusOK, fromOrg, o, err)
}

// PatchOrg handles PATCH /v1/orgs/{org}. plan, limits, redis_url,
// billing_anchor_day, leases, client_leases, sliding_windows and weight are the
// operator's alone.
func (s *Server) PatchOrg(w http.ResponseWriter, r *http.Request, org api.OrgPath) {
	var in api.OrgPatch
	b, ok := readBody(w, r)
	if !ok {
		return
	}
	if err := decodeBytes(b, &in); err != nil {
		refuse(w, r, err)
		return
	}
	patch := toOrgPatch(in)
	patch.RemoveWeight = sentNull(b, "weight") // the generated type reads null as absent
	if f := patch.OperatorOnly(); len(f) > 0 && !callerOf(r).operator {
		errs := make([]FieldError, len(f))
		for i, name := range f {
			errs[i] = FieldError{Field: name, Message: "only the operator may change this field"}
		}
		refuse(w, r, derrors.E(derrors.Forbidden, fmt.Sprintf("only the operator may change %v", f), nil, errs...))
		return
	}
	if patch.RedisURL != nil && patch.Validate() == nil && (in.RedisUrlCheck == nil || *in.RedisUrlCheck) {
		if err := reachRedis(r.Context(), *patch.RedisURL); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	o, err := s.tenants.UpdateOrg(r.Context(), actor(r), org, patch)
	respond(s, w, r, http.StatusOK, fromOrg, o, err)
}

func toOrgInput(in api.OrgCreate) tenants.OrgInput {
	o := tenants.OrgInput{ID: in.Id, Name: in.Name, PlanID: in.Plan, Limits: optLimits(in.Limits)}
	if in.Mode != nil {
		o.Mode = *in.Mode
	}
	if in.Oversubscribe != nil {
		o.Oversubscribe = *in.Oversubscribe
	}
	if in.Leases != nil {
		o.Leases = tenants.Leases(*in.Leases)
	}
	if in.ClientLeases != nil {
		o.ClientLeases = tenants.Leases(*in.ClientLeases)
	}
	if in.SlidingWindows != nil {
		o.SlidingWindows = tenants.SlidingWindows(*in.SlidingWindows)
	}
	if in.UnknownUsers != nil {
		o.UnknownUsers = tenants.UnknownUsers(*in.UnknownUsers)
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
		WebhookURL: in.WebhookUrl, RedisURL: in.RedisUrl, BillingAnchorDay: in.BillingAnchorDay, Weight: in.Weight}
	if in.Mode != nil {
		m := *in.Mode
		p.Mode = &m
	}
	if in.Leases != nil {
		l := tenants.Leases(*in.Leases)
		p.Leases = &l
	}
	if in.ClientLeases != nil {
		l := tenants.Leases(*in.ClientLeases)
		p.ClientLeases = &l
	}
	if in.SlidingWindows != nil {
		w := tenants.SlidingWindows(*in.SlidingWindows)
		p.SlidingWindows = &w
	}
	if in.UnknownUsers != nil {
		u := tenants.UnknownUsers(*in.UnknownUsers)
		p.UnknownUsers = &u
	}
	return p
}

func fromOrg(o tenants.Org) api.Org {
	out := api.Org{Id: o.ID, Name: o.Name, Plan: o.PlanID, Limits: fromLimits(o.Limits),
		EffectiveLimits: fromLimits(o.EffectiveLimits), Mode: o.Mode, Oversubscribe: o.Oversubscribe,
		WebhookUrl: o.WebhookURL, RedisUrl: redact.URL(o.RedisURL), BillingAnchorDay: o.BillingAnchorDay,
		CreatedAt: o.CreatedAt, UpdatedAt: o.UpdatedAt}
	if o.Weight > 0 {
		wt := o.Weight
		out.Weight = &wt
	}
	if o.Leases != "" {
		l := api.OrgLeases(o.Leases)
		out.Leases = &l
	}
	if o.ClientLeases != "" {
		l := api.OrgClientLeases(o.ClientLeases)
		out.ClientLeases = &l
	}
	if o.SlidingWindows != "" {
		w := api.OrgSlidingWindows(o.SlidingWindows)
		out.SlidingWindows = &w
	}
	if o.UnknownUsers != "" {
		u := api.OrgUnknownUsers(o.UnknownUsers)
		out.UnknownUsers = &u
	}
	return out
}
