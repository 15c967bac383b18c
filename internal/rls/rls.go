package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

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
	Checker checks.Engine  // the quota engine; nil answers UNAVAILABLE
	// Aliases maps other entry keys to org, team, user or metric
	// (QUOTA_GRPC_DESCRIPTOR_ALIASES, read by config.ParseAliases).
	Aliases map[string]string
	Logger  *slog.Logger
	// Registerer, when set, registers the server's metrics of calls by method and code
	// (quotaplane_grpc_server_*), as the HTTP layer's are on the api's registry.
	Registerer prometheus.Registerer
	// TracerProvider, when set, gives every call a server span (otelgrpc) for the
	// engine's spans to nest in, and the check service's event; nil adds nothing.
	TracerProvider trace.TracerProvider
	// RateLimitHeaders says which RateLimit header fields response_headers_to_add
	// carries, as the HTTP checks' (QUOTA_RATELIMIT_HEADERS); zero: both generations.
	RateLimitHeaders checks.HeaderMode
	// RLQS bounds the rate limit quota service's streams (rlqs.go); zero: the defaults.
	RLQS RLQSLimits
}

// Service implements RateLimitServiceServer.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cache   *tenants.Cache
	checks  *checks.Service
	aliases map[string]string
	log     *slog.Logger
	headers checks.HeaderMode
}

var _ rlsv3.RateLimitServiceServer = (*Service)(nil)

// New returns the service.
func New(d Deps) *Service {
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	return &Service{cache: d.Cache, aliases: d.Aliases, log: d.Logger, headers: d.RateLimitHeaders,
		checks: checks.NewService(checks.Config{Cache: d.Cache, Engine: d.Checker, Logger: d.Logger})}
}

// ShouldRateLimit decides the request's descriptors: descriptors that lie on one org
// -> team -> user path are one check (checks.Service.CheckPaths). A descriptor that
// cannot be decided (it names no check of the key's org, a hits_addend past the
// bound, a path of more metrics than a check may name) is answered OVER_LIMIT for
// itself, counting nothing, as is every descriptor of a call of more than
// MaxDescriptors; the others are decided as if it had not been sent. Errors:
// UNAUTHENTICATED (no or a bad key), PERMISSION_DENIED (a key without the check
// scope), INVALID_ARGUMENT (no descriptor at all), UNAVAILABLE (tenancy or Redis down
// under a closed plan, or too many checks in flight), as status.go's table maps the
// check service's errors.
func (s *Service) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	caller, err := s.authenticate(ctx)
	if err != nil {
		return nil, statusOf(s.log, "", err)
	}
	if err := caller.Authorize(caller.Key.OrgID); err != nil {
		return nil, statusOf(s.log, "", err)
	}
	ds := in.GetDescriptors()
	if len(ds) == 0 {
		return nil, statusOf(s.log, "", derrors.E(derrors.Invalid, fmt.Sprintf("descriptors: send 1 to %d descriptors, not 0", MaxDescriptors), nil))
	}
	if n := len(ds); n > MaxDescriptors {
		p := checks.Paths{Checks: make([]checks.PathCheck, n), Refused: n, Allowed: true}
		err := derrors.E(derrors.Invalid, fmt.Sprintf("a call carries at most %d descriptors, not %d: none was decided", MaxDescriptors, n), nil)
		for i := range p.Checks {
			p.Checks[i].Err = err
		}
		return answer(p, ds, s.headers), nil
	}
	// The inputs and the costs they point to: one allocation for Envoy's usual few.
	var ins []checks.Input
	var costs []int64
	if len(ds) <= len(inputs{}.ins) {
		in := new(inputs)
		ins, costs = in.ins[:len(ds)], in.costs[:len(ds)]
	} else {
		ins, costs = make([]checks.Input, len(ds)), make([]int64, len(ds))
	}
	var bad []error // the descriptors toInput refused, by index; nil when none
	for i, d := range ds {
		if ins[i], err = s.toInput(d, in.GetHitsAddend(), caller.Key.OrgID, &costs[i]); err != nil {
			if bad == nil {
				bad = make([]error, len(ds))
			}
			bad[i] = err
		}
	}
	at := func(j int) int { return j } // the descriptor of CheckPaths's input j
	if bad != nil {
		var idx []int
		good := ins[:0] // in place: good[k] is written after ins[k] was read
		for i := range ins {
			if bad[i] == nil {
				good, idx = append(good, ins[i]), append(idx, i)
			}
		}
		ins, at = good, func(j int) int { return idx[j] }
	}
	var p checks.Paths
	if len(ins) > 0 {
		if p, err = s.checks.CheckPaths(ctx, caller, ins); err != nil {
			if ie := (*checks.InputError)(nil); errors.As(err, &ie) {
				i := at(ie.Index)
				return nil, statusOfDescriptor(s.log, i, ds[i], ie.Err)
			}
			return nil, statusOf(s.log, "check", err)
		}
	} else {
		p.Allowed = true
	}
	if bad != nil { // the refused descriptors take their places among the decided
		all := make([]checks.PathCheck, len(ds))
		for j, c := range p.Checks {
			all[at(j)] = c
		}
		for i, e := range bad {
			if e != nil {
				all[i] = checks.PathCheck{Err: e}
				p.Refused++
			}
		}
		p.Checks = all
	}
	return answer(p, ds, s.headers), nil
}

// inputs holds the inputs of a call of up to four descriptors.
type inputs struct {
	ins   [4]checks.Input
	costs [4]int64
}

// descriptorName names descriptor i in an error or a header: its index and its
// first entries, each key and value clipped (vocab.Clip).
func descriptorName(i int, d *ratelimitv3.RateLimitDescriptor) string {
	return fmt.Sprintf("descriptor %d (%s)", i, entriesString(d))
}

// authenticate resolves the authorization metadata to an org API key. Errors:
// derrors Unauthenticated, Unavailable.
func (s *Service) authenticate(ctx context.Context) (checks.Caller, error) {
	var token string
	// ValueFromIncomingContext: FromIncomingContext copies all the metadata, three
	// allocations a call.
	if v := metadata.ValueFromIncomingContext(ctx, "authorization"); len(v) > 0 {
		t, ok := strings.CutPrefix(v[0], "Bearer ")
		if ok {
			token = strings.TrimSpace(t)
		}
	}
	if token == "" {
		return checks.Caller{}, derrors.E(derrors.Unauthenticated,
			"missing credentials: send the metadata authorization: Bearer <org API key with the check scope> (Envoy: grpc_service.initial_metadata)", nil)
	}
	k, err := s.cache.Authenticate(ctx, token)
	if errors.Is(err, tenants.ErrBadToken) {
		return checks.Caller{}, derrors.E(derrors.Unauthenticated, "invalid, unknown or revoked API key", nil)
	}
	if err != nil {
		return checks.Caller{}, derrors.E(derrors.Unavailable, "authentication: the tenancy store is unavailable; retry shortly", err)
	}
	return checks.Caller{Key: k}, nil
}

// toInput reads a descriptor's entries and cost, into cost. The cost is the
// descriptor's hits_addend when set (0 queries), else the request's when not 0, else 1.
// The input's team, user and metric point into d's entries, which outlive the call:
// no allocation per entry.
func (s *Service) toInput(d *ratelimitv3.RateLimitDescriptor, hits uint32, keyOrg string, cost *int64) (checks.Input, error) {
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
		var p *string // the value, in the message: no allocation
		if e != nil {
			p = &e.Value
		} else {
			p = new(string)
		}
		if err := s.readEntry(&in, &seen, e.GetKey(), p, keyOrg); err != nil {
			return in, err
		}
	}
	*cost = 1
	switch {
	case d.GetHitsAddend() != nil:
		// Counters are exact to MaxUnits per check (vocab.MaxUnits): more is refused
		// here, in the descriptor's own terms, before anything is counted.
		v := d.GetHitsAddend().GetValue()
		if v > uint64(vocab.MaxUnits) {
			return in, derrors.Field("hits_addend", fmt.Sprintf("must be 0 to %d", vocab.MaxUnits))
		}
		*cost = int64(v)
	case hits > 0:
		*cost = int64(hits)
	}
	in.Cost = cost
	return in, nil
}

// readEntry reads one entry (of a descriptor or an RLQS bucket id) into in: key, or
// the entry key it is an alias of, names org (which must be keyOrg), team, user or
// metric; *v is its value, which in keeps a pointer to. seen marks what was read.
func (s *Service) readEntry(in *checks.Input, seen *[4]bool, key string, v *string, keyOrg string) error {
	k := key
	if a, ok := s.aliases[k]; ok {
		k = a
	}
	var slot int
	switch k {
	case KeyOrg:
		slot = 0
		if *v != keyOrg {
			return derrors.E(derrors.Invalid, fmt.Sprintf("org %s: this key belongs to org %s and checks only its own org", vocab.Quote(*v), vocab.Quote(keyOrg)), nil)
		}
	case KeyTeam:
		slot, in.Team = 1, v
	case KeyUser:
		slot, in.User = 2, v
	case KeyMetric:
		slot, in.Metric = 3, v
	default:
		return derrors.E(derrors.Invalid, fmt.Sprintf("unknown entry key %s: use org, team, user or metric, or name it in QUOTA_GRPC_DESCRIPTOR_ALIASES", vocab.Quote(key)), nil)
	}
	if seen[slot] {
		return derrors.E(derrors.Invalid, fmt.Sprintf("entry %q is given twice", k), nil)
	}
	seen[slot] = true
	return nil
}

// answer builds Envoy's answer from the check service's: a status per descriptor,
// in order, and the RateLimit header fields (as mode says: the legacy RateLimit-Limit,
// -Remaining, -Reset and the draft-11 RateLimit-Policy and RateLimit) and, when
// denied, Retry-After, as the HTTP check's (none when the check can never pass). A
// token bucket's current_limit is its rate per unit, its limit_remaining the whole
// tokens in it, and its duration_until_reset until it is full again. A descriptor that was not decided (its
// PathCheck's Err) is OVER_LIMIT with no current_limit, and the answer is then
// OVER_LIMIT and carries Quotaplane-Refused (refusedField) naming the first such
// descriptor and why; it adds no Retry-After of its own, since no wait would help.
func answer(p checks.Paths, ds []*ratelimitv3.RateLimitDescriptor, mode checks.HeaderMode) *rlsv3.RateLimitResponse {
	// The messages of one kind are allocated together, and every string of the answer
	// is a part of one: a few allocations a call, not a few per descriptor
	// (BenchmarkServerShouldRateLimitPath).
	n := len(p.Checks)
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	// a status, its limit and its reset: one allocation for all descriptors
	type status struct {
		st  rlsv3.RateLimitResponse_DescriptorStatus
		lim rlsv3.RateLimitResponse_RateLimit
		dur durationpb.Duration
	}
	sts := make([]status, n)
	var buf [512]byte
	b := buf[:0]
	var ends [2*MaxDescriptors + 8]int // where each string of b ends, in order
	ne := 0
	mark := func() { ends[ne] = len(b); ne++ }
	for _, c := range p.Checks {
		if t := c.RateLimit; c.HasRateLimit {
			b = append(b, t.Level.Level...)
			b = append(b, ' ')
			b = append(b, t.Level.ID...)
			b = append(b, ' ')
			b = append(b, c.Metric...)
			b = append(b, " per "...)
			b = append(b, t.Level.Window...)
			mark()
		}
	}
	legacy := p.HasRateLimit && mode.Legacy()
	draft := p.HasRateLimit && mode.Draft()
	nh := 0
	if t := p.RateLimit; legacy {
		b = strconv.AppendInt(b, t.Limit, 10)
		mark()
		b = strconv.AppendInt(b, t.Remaining, 10)
		mark()
		b = strconv.AppendInt(b, t.Reset, 10)
		mark()
		nh += 3
	}
	if draft {
		b = checks.AppendPolicyField(b, p.Levels, "")
		mark()
		b = checks.AppendLimitField(b, p.RateLimit)
		mark()
		nh += 2
	}
	retry := !p.Allowed && p.RetryAfter > 0 // 0: it can never pass (a cost above a bucket's burst)
	if retry {
		b = strconv.AppendInt(b, p.RetryAfter, 10)
		mark()
		nh++
	}
	if p.Warning != "" {
		nh++
	}
	if p.Degraded {
		nh++
	}
	if p.Refused > 0 {
		nh++
	}
	all := string(b)
	from, next := 0, 0
	str := func() string { s := all[from:ends[next]]; from = ends[next]; next++; return s }
	for i, c := range p.Checks {
		st := &sts[i].st
		out.Statuses[i] = st
		st.Code = rlsv3.RateLimitResponse_OK
		if c.Err != nil {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			continue
		}
		if !c.Allowed {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if t := c.RateLimit; c.HasRateLimit {
			l := &sts[i].lim
			l.Name, l.RequestsPerUnit, l.Unit = str(), clampU32(t.Limit), unitOf(t.Level.Window)
			st.CurrentLimit = l
			st.LimitRemaining = clampU32(t.Remaining)
			d := &sts[i].dur
			dd := time.Duration(t.Reset) * time.Second // as durationpb.New fills it
			d.Seconds, d.Nanos = int64(dd/time.Second), int32(dd%time.Second)
			st.DurationUntilReset = d
		}
	}
	if !p.Allowed || p.Refused > 0 {
		out.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if nh == 0 {
		return out
	}
	hs := make([]corev3.HeaderValue, nh)
	out.ResponseHeadersToAdd = make([]*corev3.HeaderValue, 0, nh)
	add := func(k, v string) {
		h := &hs[len(out.ResponseHeadersToAdd)]
		h.Key, h.Value = k, v
		out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd, h)
	}
	if legacy {
		add("RateLimit-Limit", str())
		add("RateLimit-Remaining", str())
		add("RateLimit-Reset", str())
	}
	if draft {
		add("RateLimit-Policy", str())
		add("RateLimit", str())
	}
	if retry {
		add("Retry-After", str())
	}
	if p.Warning != "" {
		add("Quotaplane-Warning", p.Warning)
	}
	if p.Degraded {
		add("Quotaplane-Degraded", "true")
	}
	if p.Refused > 0 {
		add("Quotaplane-Refused", refusedField(p, ds))
	}
	return out
}

// maxRefusedField is the most bytes Quotaplane-Refused carries.
const maxRefusedField = 512

// refusedField is Quotaplane-Refused's value: the first descriptor that was not
// decided, named as in an error (descriptorName: its index and clipped entries),
// why, in the words an error would use, and how many more were refused; at most
// maxRefusedField bytes, cut at a character with "…".
func refusedField(p checks.Paths, ds []*ratelimitv3.RateLimitDescriptor) string {
	var v string
	for i, c := range p.Checks {
		if c.Err != nil {
			v = descriptorName(i, ds[i]) + ": " + clipValues(wordsOf(c.Err), ds[i])
			break
		}
	}
	if p.Refused > 1 {
		v += fmt.Sprintf("; %d more descriptors refused", p.Refused-1)
	}
	if len(v) > maxRefusedField {
		cut := maxRefusedField - len("…")
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = v[:cut] + "…"
	}
	return v
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

// clipValues is msg with every key and value of d's entries longer than
// vocab.MaxEcho characters cut as vocab.Clip cuts it: whatever a message of the
// check service quotes of a descriptor, no more than MaxEcho characters of a value
// go back to the caller.
func clipValues(msg string, d *ratelimitv3.RateLimitDescriptor) string {
	for _, e := range d.GetEntries() {
		for _, v := range [2]string{e.GetKey(), e.GetValue()} {
			if cut := vocab.Clip(v); cut != v {
				msg = strings.ReplaceAll(msg, v, cut)
			}
		}
	}
	return msg
}

// maxEntriesNamed is the most entries of a descriptor its name shows; a descriptor
// that names a check has at most four.
const maxEntriesNamed = 4

// entriesString is d's entries as key=value, at most maxEntriesNamed of them, each
// key and value clipped to vocab.MaxEcho characters.
func entriesString(d *ratelimitv3.RateLimitDescriptor) string {
	es := d.GetEntries()
	parts := make([]string, 0, min(len(es), maxEntriesNamed)+1)
	for _, e := range es[:min(len(es), maxEntriesNamed)] {
		parts = append(parts, vocab.Clip(e.GetKey())+"="+vocab.Clip(e.GetValue()))
	}
	if n := len(es) - maxEntriesNamed; n > 0 {
		parts = append(parts, fmt.Sprintf("%d more", n))
	}
	return strings.Join(parts, ", ")
}
