// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) over the quota engine,
// so that Envoy's and Istio's global rate limit filter can ask Quotaplane instead of
// envoyproxy/ratelimit. The protocol is go-control-plane's generated code; this
// package maps descriptors to checks (resolved by internal/checks, as POST /v1/check
// resolves them) and decisions to Envoy's answer.
//
// A descriptor's entries name one check: org (optional: the key's org), team, user
// and metric (default "requests"); other entry keys may be configured as aliases of
// those four. The descriptors of one request that lie on one org -> team -> user path
// are decided as one atomic check, counted once with the largest of their costs;
// descriptors on different paths are each decided on their own.
package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Checker decides checks on the Redis an org's route names. *quota.Engines satisfies it.
type Checker interface {
	Check(ctx context.Context, route vocab.Route, req quota.Request) (quota.Result, quota.Outcome, error)
	CheckBatch(ctx context.Context, routes []vocab.Route, reqs []quota.Request) ([]quota.Result, []quota.Outcome, []error)
	// Now is the time route's checks are decided at (the engine's Redis time), which
	// judges a throttle's expiry and the seconds until a reset.
	Now(route vocab.Route) time.Time
}

// MaxDescriptors is the most descriptors one ShouldRateLimit may carry, as a
// /v1/check/batch carries at most 100 checks.
const MaxDescriptors = 100

// The entry keys a descriptor may use (besides configured aliases).
const (
	KeyOrg    = "org"
	KeyTeam   = "team"
	KeyUser   = "user"
	KeyMetric = "metric"
)

// Deps is what the service needs.
type Deps struct {
	Cache   *tenants.Cache // resolved orgs, users and keys
	Checker Checker        // nil answers UNAVAILABLE
	// Aliases maps other entry keys to org, team, user or metric (ParseAliases).
	Aliases map[string]string
	Logger  *slog.Logger
}

// Service implements RateLimitServiceServer.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cache   *tenants.Cache
	checker Checker
	aliases map[string]string
	log     *slog.Logger
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// New returns the service.
func New(d Deps) *Service {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	return &Service{cache: d.Cache, checker: d.Checker, aliases: d.Aliases, log: d.Logger}
}

// NewServer returns a gRPC server carrying the service and the standard health
// service (grpc.health.v1), SERVING for "" and the rate limit service's name. Stop
// it with GracefulStop, after health's Shutdown (returned) has told load balancers.
func NewServer(d Deps, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	g := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(g, New(d))
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	h.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, h)
	return g, h
}

// ParseAliases reads "x-user-id=user,tenant=org": each alias names the entry key
// (org, team, user or metric) it stands for.
func ParseAliases(s string) (map[string]string, error) {
	out := map[string]string{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		alias, key, ok := strings.Cut(part, "=")
		alias, key = strings.TrimSpace(alias), strings.TrimSpace(key)
		switch {
		case !ok || alias == "":
			return nil, fmt.Errorf("%q: want alias=key, such as x-user-id=user", part)
		case key != KeyOrg && key != KeyTeam && key != KeyUser && key != KeyMetric:
			return nil, fmt.Errorf("%q: an alias stands for org, team, user or metric, not %q", part, key)
		case alias == KeyOrg || alias == KeyTeam || alias == KeyUser || alias == KeyMetric:
			return nil, fmt.Errorf("%q: %s is an entry key already and cannot be an alias", part, alias)
		}
		if _, dup := out[alias]; dup {
			return nil, fmt.Errorf("alias %q given twice", alias)
		}
		out[alias] = key
	}
	return out, nil
}

// check is one descriptor's check, resolved.
type check struct {
	req   quota.Request
	route vocab.Route
	ans   checks.Answer
	group int // index of its path's group
}

// group is one path: the deepest of its descriptors' requests, decided once.
type group struct {
	req   quota.Request
	route vocab.Route
	ans   checks.Answer
	res   quota.Result
	oc    quota.Outcome
}

// ShouldRateLimit decides the request's descriptors. Errors: UNAUTHENTICATED (no or
// a bad key), PERMISSION_DENIED (a key without the check scope), INVALID_ARGUMENT (a
// descriptor that names no check of the key's org), UNAVAILABLE (tenancy or Redis
// down under a closed plan, or too many checks in flight).
func (s *Service) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	key, err := s.authenticate(ctx)
	if err != nil {
		return nil, err
	}
	n := len(in.GetDescriptors())
	if n == 0 || n > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "descriptors: send 1 to %d descriptors, not %d", MaxDescriptors, n)
	}
	if s.checker == nil {
		return nil, status.Error(codes.Unavailable, "no quota engine is configured")
	}
	caller := checks.Caller{Key: key}
	resolver := checks.Resolver{Cache: s.cache, Clock: s.checker}
	cs := make([]check, n)
	for i, d := range in.GetDescriptors() {
		input, err := s.toInput(d, in.GetHitsAddend(), key.OrgID)
		if err == nil {
			cs[i].req, cs[i].route, cs[i].ans, err = resolver.Resolve(ctx, caller, input)
		}
		if err != nil {
			return nil, s.statusOf(fmt.Sprintf("descriptor %d (%s)", i, entriesString(d)), err)
		}
	}
	groups := pathGroups(cs)
	if err := s.decide(ctx, groups); err != nil {
		return nil, err
	}
	return answer(cs, groups, checks.Now(s.checker, cs[0].route)), nil
}

// authenticate resolves the authorization metadata to an org API key with the check
// scope.
func (s *Service) authenticate(ctx context.Context) (tenants.APIKey, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var token string
	if v := md.Get("authorization"); len(v) > 0 {
		t, ok := strings.CutPrefix(v[0], "Bearer ")
		if ok {
			token = strings.TrimSpace(t)
		}
	}
	if token == "" {
		return tenants.APIKey{}, status.Error(codes.Unauthenticated,
			"missing credentials: send the metadata authorization: Bearer <org API key with the check scope> (Envoy: grpc_service.initial_metadata)")
	}
	k, err := s.cache.Authenticate(ctx, token)
	if errors.Is(err, tenants.ErrBadToken) {
		return tenants.APIKey{}, status.Error(codes.Unauthenticated, "invalid, unknown or revoked API key")
	}
	if err != nil {
		return tenants.APIKey{}, s.statusOf("authentication", derrors.E(derrors.Unavailable, "the tenancy store is unavailable; retry shortly", err))
	}
	if !k.HasScope(tenants.ScopeCheck) {
		return tenants.APIKey{}, status.Error(codes.PermissionDenied, "this key lacks the scope ShouldRateLimit needs: check")
	}
	return k, nil
}

// toInput reads a descriptor's entries and cost. The cost is the descriptor's
// hits_addend when set (0 queries), else the request's when not 0, else 1.
func (s *Service) toInput(d *ratelimitv3.RateLimitDescriptor, hits uint32, keyOrg string) (checks.Input, error) {
	in := checks.Input{Org: keyOrg}
	if len(d.GetEntries()) == 0 {
		return in, derrors.E(derrors.Invalid, "a descriptor needs at least one entry: org, team, user or metric", nil)
	}
	if d.GetLimit() != nil {
		return in, derrors.E(derrors.Invalid, "limit overrides are not supported: limits come from the org's plan, overrides and allocations in Quotaplane", nil)
	}
	if d.GetIsNegativeHits() {
		return in, derrors.E(derrors.Invalid, "is_negative_hits is not supported: Quotaplane does not refund units", nil)
	}
	var seen [4]bool
	for _, e := range d.GetEntries() {
		k := e.GetKey()
		if a, ok := s.aliases[k]; ok {
			k = a
		}
		v := e.GetValue()
		var slot int
		switch k {
		case KeyOrg:
			slot = 0
			if v != keyOrg {
				return in, derrors.E(derrors.Invalid, fmt.Sprintf("org %q: this key belongs to org %q and checks only its own org", v, keyOrg), nil)
			}
		case KeyTeam:
			slot, in.Team = 1, &v
		case KeyUser:
			slot, in.User = 2, &v
		case KeyMetric:
			slot, in.Metric = 3, &v
		default:
			return in, derrors.E(derrors.Invalid, fmt.Sprintf("unknown entry key %q: use org, team, user or metric, or name it in QUOTA_GRPC_DESCRIPTOR_ALIASES", e.GetKey()), nil)
		}
		if seen[slot] {
			return in, derrors.E(derrors.Invalid, fmt.Sprintf("entry %q is given twice", k), nil)
		}
		seen[slot] = true
	}
	cost := int64(1)
	switch {
	case d.GetHitsAddend() != nil:
		// Counters are exact to MaxUnits per check (vocab.MaxUnits): more is refused
		// here, in the descriptor's own terms, before anything is counted.
		v := d.GetHitsAddend().GetValue()
		if v > uint64(vocab.MaxUnits) {
			return in, derrors.Field("hits_addend", fmt.Sprintf("must be 0 to %d", vocab.MaxUnits))
		}
		cost = int64(v)
	case hits > 0:
		cost = int64(hits)
	}
	in.Cost = &cost
	return in, nil
}

// pathGroups gathers the checks that lie on one org -> team -> user path of one
// metric into groups, deepest first: a user's check takes in its team's and its org's
// of the same metric; a team's takes in its org's. It sets each check's group.
func pathGroups(cs []check) []group {
	order := make([]int, len(cs))
	for i := range order {
		order[i] = i
	}
	depth := func(r quota.Request) int {
		switch {
		case r.User != "":
			return 2
		case r.Team != "":
			return 1
		}
		return 0
	}
	slices.SortStableFunc(order, func(a, b int) int { return depth(cs[b].req) - depth(cs[a].req) })
	var gs []group
	for _, i := range order {
		r := cs[i].req
		gi := slices.IndexFunc(gs, func(g group) bool {
			return g.req.Org == r.Org && g.req.Metric == r.Metric &&
				(r.Team == "" || r.Team == g.req.Team) && (r.User == "" || r.User == g.req.User)
		})
		if gi < 0 {
			gs = append(gs, group{req: r, route: cs[i].route, ans: cs[i].ans})
			gi = len(gs) - 1
		} else {
			gs[gi].req.Cost = max(gs[gi].req.Cost, r.Cost)
		}
		cs[i].group = gi
	}
	return gs
}

// decide runs the groups' checks: one check, or one pipelined batch.
func (s *Service) decide(ctx context.Context, gs []group) error {
	if len(gs) == 1 {
		res, oc, err := s.checker.Check(ctx, gs[0].route, gs[0].req)
		if err != nil {
			return s.statusOf("check", err)
		}
		gs[0].res, gs[0].oc = res, oc
		return nil
	}
	routes := make([]vocab.Route, len(gs))
	reqs := make([]quota.Request, len(gs))
	for i, g := range gs {
		routes[i], reqs[i] = g.route, g.req
	}
	results, outcomes, errs := s.checker.CheckBatch(ctx, routes, reqs)
	for i := range gs {
		if errs[i] != nil {
			return s.statusOf("check", errs[i])
		}
		gs[i].res, gs[i].oc = results[i], outcomes[i]
	}
	return nil
}

// answer builds Envoy's answer: a status per descriptor, in order, and the
// RateLimit-* (and, when denied, Retry-After) headers of the HTTP check.
func answer(cs []check, gs []group, now time.Time) *rlsv3.RateLimitResponse {
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(cs))}
	for i, c := range cs {
		g := gs[c.group]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if !g.res.Allowed {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if t, ok := checks.Tightest(levelsOf(g.res, c.req), now); ok {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
				Name:            fmt.Sprintf("%s %s %s per %s", t.Level.Level, t.Level.ID, c.req.Metric, t.Level.Window),
				RequestsPerUnit: clampU32(t.Limit), Unit: unitOf(t.Level.Window)}
			st.LimitRemaining = clampU32(t.Remaining)
			st.DurationUntilReset = durationpb.New(time.Duration(t.Reset) * time.Second)
		}
		out.Statuses[i] = st
	}
	// The headers describe the first denied path, else the tightest of all.
	all := quota.Result{Allowed: true}
	for _, g := range gs {
		if !g.res.Allowed {
			all = g.res
			out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			break
		}
		all.Levels = append(all.Levels, g.res.Levels...)
	}
	if t, ok := checks.Tightest(all, now); ok {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd,
			header("RateLimit-Limit", t.Limit), header("RateLimit-Remaining", t.Remaining), header("RateLimit-Reset", t.Reset))
	}
	if !all.Allowed {
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, header("Retry-After", checks.RetryAfterSeconds(all)))
	}
	for _, g := range gs {
		if w := checks.Warning(g.res, g.ans.Mode); w != "" {
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "Quotaplane-Warning", Value: w})
			break
		}
	}
	for _, g := range gs {
		if g.oc.Degraded {
			out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, &corev3.HeaderValue{Key: "Quotaplane-Degraded", Value: "true"})
			break
		}
	}
	return out
}

// levelsOf is the part of a path's result that a descriptor names: its own level and
// those above it. A team's descriptor merged into a user's path is described by the
// team's and org's limits, not the user's.
func levelsOf(res quota.Result, req quota.Request) quota.Result {
	if req.User != "" {
		return res
	}
	out := res
	out.Levels = make([]quota.LevelStatus, 0, len(res.Levels))
	for _, l := range res.Levels {
		if l.Level == vocab.LevelOrg || (l.Level == vocab.LevelTeam && req.Team != "") {
			out.Levels = append(out.Levels, l)
		}
	}
	return out
}

func header(k string, v int64) *corev3.HeaderValue {
	return &corev3.HeaderValue{Key: k, Value: strconv.FormatInt(v, 10)}
}

func clampU32(v int64) uint32 {
	return uint32(min(max(v, 0), math.MaxUint32))
}

// unitOf is a window in Envoy's units.
func unitOf(w vocab.Window) rlsv3.RateLimitResponse_RateLimit_Unit {
	switch w {
	case vocab.Second:
		return rlsv3.RateLimitResponse_RateLimit_SECOND
	case vocab.Minute:
		return rlsv3.RateLimitResponse_RateLimit_MINUTE
	case vocab.Hour:
		return rlsv3.RateLimitResponse_RateLimit_HOUR
	case vocab.Day:
		return rlsv3.RateLimitResponse_RateLimit_DAY
	case vocab.Month:
		return rlsv3.RateLimitResponse_RateLimit_MONTH
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

func entriesString(d *ratelimitv3.RateLimitDescriptor) string {
	parts := make([]string, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		parts[i] = e.GetKey() + "=" + e.GetValue()
	}
	return strings.Join(parts, ", ")
}

// statusOf is the gRPC status of an error: the one map of error kinds to codes of
// this transport. Unavailable and internal errors are logged; their causes are not
// sent.
func (s *Service) statusOf(what string, err error) error {
	if errors.Is(err, quota.ErrInvalid) {
		return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	}
	var unknown *tenants.UnknownMetricError
	if errors.As(err, &unknown) {
		return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	}
	detail := err.Error()
	var de *derrors.Error
	if errors.As(err, &de) {
		detail = de.Detail
	}
	switch k := derrors.KindOf(err); k {
	case derrors.Invalid, derrors.NotFound, derrors.Unprocessable:
		return status.Errorf(codes.InvalidArgument, "%s: %s", what, detail)
	case derrors.Forbidden:
		return status.Errorf(codes.PermissionDenied, "%s: %s", what, detail)
	case derrors.Unauthenticated:
		return status.Errorf(codes.Unauthenticated, "%s: %s", what, detail)
	case derrors.Canceled:
		return status.Errorf(codes.Canceled, "%s: the caller went away", what)
	case derrors.Overloaded:
		return status.Errorf(codes.Unavailable, "%s: too many checks of this org are in flight; retry shortly", what)
	default:
		s.log.Warn("rate limit check not decided", "what", what, "err", err.Error())
		return status.Errorf(codes.Unavailable, "%s: the quota store is unavailable; retry shortly", what)
	}
}
