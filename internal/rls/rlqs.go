package rls

import (
	"context"
	"errors"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
)

// Envoy's rate limit quota service (RLQS; doc.go "Envoy's rate limit quota service"):
// a proxy enforces locally the assignments this service pushes it, and reports what it
// admitted. Every token bucket assignment is a proxy lease (checks.Service.Lease,
// HolderProxy): taken from every level of its path before it is sent, for the most the
// proxy can admit under it; settled by the proxy's reports; counted whole when its
// reservation expires unreported.

// RLQSLimits bound the rate limit quota service's streams.
type RLQSLimits struct {
	// AssignmentLife (QUOTA_RLQS_ASSIGNMENT_LIFE, default DefaultAssignmentLife) is the
	// longest TTL of a token bucket assignment; it ends sooner with the current bucket
	// of the path's shortest sliding window and with the period (quota.LeaseEnd).
	AssignmentLife time.Duration
	// MaxBuckets (QUOTA_RLQS_MAX_BUCKETS, default DefaultMaxBuckets) bounds the buckets
	// one stream watches; a bucket past it is assigned DENY_ALL, counting nothing, and
	// past twice it not answered (the filter's no_assignment_behavior applies).
	MaxBuckets int
	// IdleTimeout (QUOTA_RLQS_IDLE_TIMEOUT, default DefaultIdleTimeout) closes a stream
	// that sent nothing for so long (status OK; Envoy opens another when it reports).
	IdleTimeout time.Duration
	// ReportLag (QUOTA_RLQS_REPORT_LAG, default DefaultReportLag) is the bound assumed
	// on a report's way back: an assignment is settled by the first report received
	// this long after the proxy could last admit under it. A report later than that
	// is counted on the bucket's next assignment, never lost.
	ReportLag time.Duration
}

// Defaults of RLQSLimits.
const (
	DefaultAssignmentLife = 2 * time.Second
	DefaultMaxBuckets     = 1024
	DefaultIdleTimeout    = 5 * time.Minute
	DefaultReportLag      = 250 * time.Millisecond
)

const (
	// firstRate sizes a bucket's first assignment, before any report says its rate
	// (units a second); the headroom's share still bounds it.
	firstRate = 100.0
	// maxRate bounds a reported rate, so an assignment's max_tokens and tokens_per_fill
	// fit Envoy's uint32.
	maxRate = 1 << 30
	// faultTTL is how long an undecidable bucket's DENY_ALL lasts, errorTTL one
	// denied because the service failed (the quota store down).
	faultTTL = time.Minute
	errorTTL = time.Second
	// minDecideGap is the least time between two decisions of one bucket: a report
	// flood decides each bucket at most so often.
	minDecideGap = 50 * time.Millisecond
	// recheckDenied is how often a bucket denied near a limit is decided again while
	// its proxy reports demand: units held by other assignments may have come back.
	recheckDenied = time.Second
	// idleBucket: a bucket without traffic so long is not renewed; its assignment
	// lapses and the next report with traffic is answered at once.
	idleBucket = 30 * time.Second
	// settleTimeout bounds a settlement made after the stream ended.
	settleTimeout = 5 * time.Second
	// leaseGrace is the time checks gives a lease after its end before it is counted
	// whole (settle_by); an assignment not settled by then is forgotten here.
	leaseGrace = 5 * time.Second
)

// rlqsMetrics are the RLQS families (docs/ARCHITECTURE.md "Metrics"); nil fields count
// nothing.
type rlqsMetrics struct {
	streams     prometheus.Gauge
	buckets     prometheus.Gauge
	assignments *prometheus.CounterVec
	outstanding prometheus.Gauge
	lost        prometheus.Counter
	unassigned  prometheus.Counter
}

func newRLQSMetrics(reg prometheus.Registerer) *rlqsMetrics {
	m := &rlqsMetrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_rlqs_streams",
			Help: "RLQS streams open (Envoy's rate limit quota service)."}),
		buckets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_rlqs_buckets",
			Help: "RLQS buckets watched by the open streams."}),
		assignments: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "quotaplane_rlqs_assignments_total",
			Help: "RLQS assignments sent, by strategy (token_bucket, deny_all)."}, []string{"strategy"}),
		outstanding: prometheus.NewGauge(prometheus.GaugeOpts{Name: "quotaplane_rlqs_outstanding_units",
			Help: "Units reserved for RLQS assignments and not yet reported admitted."}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_rlqs_lost_units_total",
			Help: "Units of RLQS assignments left unreported by a stream that ended or a report that never came, counted as used."}),
		unassigned: prometheus.NewCounter(prometheus.CounterOpts{Name: "quotaplane_rlqs_unassigned_units_total",
			Help: "Requests reported admitted by a proxy with no open assignment of the bucket (a fallback that allows): not counted."}),
	}
	m.assignments.WithLabelValues("token_bucket")
	m.assignments.WithLabelValues("deny_all")
	if reg != nil {
		reg.MustRegister(m.streams, m.buckets, m.assignments, m.outstanding, m.lost, m.unassigned)
	}
	return m
}

// quotaService implements RateLimitQuotaServiceServer over the rate limit service's
// Service: the same key, aliases and check service.
type quotaService struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	s   *Service
	lim RLQSLimits
	m   *rlqsMetrics
}

var _ rlqsv3.RateLimitQuotaServiceServer = (*quotaService)(nil)

func newQuotaService(s *Service, lim RLQSLimits, m *rlqsMetrics) *quotaService {
	if lim.AssignmentLife <= 0 {
		lim.AssignmentLife = DefaultAssignmentLife
	}
	lim.AssignmentLife = min(lim.AssignmentLife, checks.ProxyLeaseMaxLife)
	if lim.MaxBuckets <= 0 {
		lim.MaxBuckets = DefaultMaxBuckets
	}
	if lim.IdleTimeout <= 0 {
		lim.IdleTimeout = DefaultIdleTimeout
	}
	if lim.ReportLag <= 0 {
		lim.ReportLag = DefaultReportLag
	}
	if m == nil {
		m = newRLQSMetrics(nil)
	}
	return &quotaService{s: s, lim: lim, m: m}
}

// StreamRateLimitQuotas serves one proxy's stream: authenticated as ShouldRateLimit is
// (the key in the stream's metadata, Envoy's initial_metadata; again on every report,
// so a revoked key ends the stream), it watches each bucket the proxy reports, answers
// a new or starving bucket at once and renews live ones ahead of their TTL. Errors:
// UNAUTHENTICATED, PERMISSION_DENIED (status.go's table); an idle stream ends OK.
func (q *quotaService) StreamRateLimitQuotas(stream grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]) error {
	ctx := stream.Context()
	caller, err := q.s.authenticate(ctx)
	if err == nil {
		err = caller.Authorize(caller.Key.OrgID)
	}
	if err != nil {
		return statusOf(q.s.log, "", err)
	}
	q.m.streams.Inc()
	defer q.m.streams.Dec()
	st := &quotaStream{q: q, ctx: ctx, caller: caller, stream: stream, buckets: map[string]*bucket{}}
	defer st.end()
	return st.run()
}

// quotaStream is one proxy's stream: run by one goroutine (run), Recv in another.
type quotaStream struct {
	q       *quotaService
	ctx     context.Context
	caller  checks.Caller
	stream  grpc.BidiStreamingServer[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	buckets map[string]*bucket
	out     []*rlqsv3.RateLimitQuotaResponse_BucketAction
	// reported is when the last report arrived: what it says covers the proxy's
	// admissions until ReportLag before.
	reported time.Time
}

// Strategies a bucket was last sent.
const (
	sentNone = iota
	sentTokens
	sentDeny
)

// bucket is a watched bucket of a stream.
type bucket struct {
	id      *rlqsv3.BucketId
	in      checks.Input
	fault   error // undecidable: DENY_ALL, counting nothing
	sent    int   // sentNone, sentTokens, sentDeny
	expires time.Time
	due     time.Time // its next decision; zero: none
	decided time.Time
	rate    float64   // units a second the proxy last saw asked, admitted or not
	active  time.Time // last report with traffic
	last    time.Time // last report of it
	open    []*assignment
	// strategy last sent, so the next differs (never extended: bucketStrategy)
	fill time.Duration
}

// assignment is a token bucket assignment's lease, open until a report covers its end.
type assignment struct {
	id           string
	amount, used int64
	stop         time.Time // the latest the proxy may admit under it (before the way there)
	forget       time.Time // its lease's settle_by: counted whole by then
}

func (st *quotaStream) run() error {
	type recv struct {
		m   *rlqsv3.RateLimitQuotaUsageReports
		err error
	}
	in := make(chan recv)
	go func() {
		for {
			m, err := st.stream.Recv()
			select {
			case in <- recv{m, err}:
			case <-st.ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	idle := time.NewTimer(st.q.lim.IdleTimeout)
	defer idle.Stop()
	wake := time.NewTimer(time.Hour)
	defer wake.Stop()
	for {
		select {
		case r := <-in:
			if errors.Is(r.err, io.EOF) {
				return nil
			}
			if r.err != nil {
				return r.err
			}
			idle.Reset(st.q.lim.IdleTimeout)
			if err := st.report(r.m, time.Now()); err != nil {
				return err
			}
		case <-wake.C:
		case <-idle.C:
			return nil
		case <-st.ctx.Done():
			return nil
		}
		now := time.Now()
		next := st.decideDue(now)
		if err := st.flush(); err != nil {
			return err
		}
		wake.Reset(max(time.Until(next), time.Millisecond))
	}
}

// report reads one message of usage reports: each bucket's admitted units settle its
// assignments, its demand sizes the next, a new bucket is answered at once and a
// starving one (requests denied) soon.
func (st *quotaStream) report(m *rlqsv3.RateLimitQuotaUsageReports, now time.Time) error {
	caller, err := st.q.s.authenticate(st.ctx)
	if err == nil {
		err = caller.Authorize(caller.Key.OrgID)
	}
	if err != nil {
		return statusOf(st.q.s.log, "", err)
	}
	st.caller = caller
	st.reported = now
	for _, u := range m.GetBucketQuotaUsages() {
		key := bucketKey(u.GetBucketId())
		b := st.buckets[key]
		if b == nil {
			if len(st.buckets) >= 2*st.q.lim.MaxBuckets {
				st.q.m.unassigned.Add(float64(u.GetNumRequestsAllowed()))
				continue // not answered: the filter's no_assignment_behavior applies
			}
			b = st.watch(u.GetBucketId(), now)
			st.buckets[key] = b
			st.q.m.buckets.Inc()
		}
		st.settle(b, u.GetNumRequestsAllowed(), now)
		allowed, denied := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
		elapsed := u.GetTimeElapsed().AsDuration()
		if elapsed <= 0 && !b.last.IsZero() {
			elapsed = now.Sub(b.last)
		}
		if elapsed > 0 {
			b.rate = min(float64(allowed+denied)/elapsed.Seconds(), maxRate)
		}
		b.last = now
		if allowed+denied > 0 {
			b.active = now
		}
		if denied == 0 || b.fault != nil {
			continue
		}
		// starving: denied requests while no assignment lets them through
		soon := b.decided.Add(minDecideGap)
		if b.sent == sentDeny {
			soon = b.decided.Add(recheckDenied)
		}
		soon = later(soon, now)
		if b.due.IsZero() || soon.Before(b.due) {
			b.due = soon
		}
	}
	return nil
}

// watch starts watching bucket id: its check, or the fault that leaves it undecidable;
// it is decided at once.
func (st *quotaStream) watch(id *rlqsv3.BucketId, now time.Time) *bucket {
	b := &bucket{id: id, due: now, active: now}
	if len(st.buckets) >= st.q.lim.MaxBuckets {
		b.fault = derrors.E(derrors.Invalid, "too many buckets on one stream", nil)
		return b
	}
	org := st.caller.Key.OrgID
	b.in = checks.Input{Org: org}
	es := id.GetBucket()
	if len(es) == 0 {
		b.fault = derrors.E(derrors.Invalid, "a bucket id needs at least one entry: org, team, user or metric", nil)
		return b
	}
	var seen [4]bool
	for _, k := range sortedKeys(es) {
		v := es[k]
		if err := st.q.s.readEntry(&b.in, &seen, k, &v, org); err != nil {
			b.fault = err
			return b
		}
	}
	return b
}

// settle attributes n admitted units to b's open assignments, oldest first, each up to
// its amount (past them all, to the newest: counted over its amount, never dropped),
// and settles each assignment the proxy can no longer admit under and that this report
// covers: its used units counted, the rest given back.
func (st *quotaStream) settle(b *bucket, n uint64, now time.Time) {
	rest := int64(min(n, math.MaxInt64/2))
	for _, a := range b.open {
		take := min(max(a.amount-a.used, 0), rest)
		a.used += take
		rest -= take
		st.q.m.outstanding.Sub(float64(take))
	}
	if rest > 0 {
		if len(b.open) == 0 {
			st.q.m.unassigned.Add(float64(rest))
		} else {
			b.open[len(b.open)-1].used += rest
		}
	}
	for len(b.open) > 0 {
		a := b.open[0]
		if now.After(a.forget) {
			st.lose(a) // its lease expired unsettled: counted whole
		} else if !a.stop.Add(st.q.lim.ReportLag).Before(now) {
			break
		} else {
			st.commit(st.ctx, a)
		}
		b.open = b.open[1:]
	}
}

// commit settles a with what was reported admitted under it.
func (st *quotaStream) commit(ctx context.Context, a *assignment) {
	st.q.m.outstanding.Sub(float64(max(a.amount-a.used, 0)))
	if _, _, err := st.q.s.checks.SettleLease(ctx, st.caller, a.id, a.used, false, nil); err != nil {
		// unsettled, its lease is counted whole at its settle_by: never less than used
		st.q.s.log.Warn("RLQS assignment not settled", "org", st.caller.Key.OrgID, "err", err.Error())
	}
}

// lose leaves a to be counted whole when its lease expires: the proxy may have
// admitted all of it unreported.
func (st *quotaStream) lose(a *assignment) {
	rest := float64(max(a.amount-a.used, 0))
	st.q.m.outstanding.Sub(rest)
	st.q.m.lost.Add(rest)
}

// decideDue decides every bucket whose time has come, and returns when the next is due.
func (st *quotaStream) decideDue(now time.Time) time.Time {
	next := now.Add(time.Hour)
	for _, b := range st.buckets {
		if !b.due.IsZero() && !b.due.After(now) {
			st.decide(b, now)
		}
		if !b.due.IsZero() && b.due.Before(next) {
			next = b.due
		}
	}
	return next
}

// decide sends b its next assignment: a token bucket of a lease just taken, or
// DENY_ALL (undecidable, near or at a limit, not leasable, the service failing).
func (st *quotaStream) decide(b *bucket, now time.Time) {
	b.due = time.Time{}
	if b.sent == sentTokens && now.Sub(b.active) > idleBucket {
		return // no traffic: let the assignment lapse
	}
	b.decided = now
	if b.fault != nil {
		st.deny(b, faultTTL, now)
		return
	}
	rate := b.rate
	if rate == 0 && b.sent == sentNone {
		rate = firstRate // no report has said its rate yet
	}
	l, err := st.q.s.checks.Lease(st.ctx, st.caller, checks.LeaseInput{Check: b.in, Rate: &rate,
		Holder: checks.HolderProxy, Life: st.q.lim.AssignmentLife})
	switch {
	case err != nil && checks.InputFault(err):
		b.fault = err
		st.deny(b, faultTTL, now)
	case err != nil:
		if derrors.KindOf(err) != derrors.Canceled {
			st.q.s.log.Warn("RLQS bucket not decided", "org", st.caller.Key.OrgID, "err", err.Error())
		}
		st.deny(b, errorTTL, now)
		b.due = now.Add(errorTTL)
	case l.Units == 0:
		st.deny(b, l.TTL, now)
		if l.Reason == checks.LeaseAtWindowEdge {
			b.due = now.Add(l.TTL)
		}
	default:
		st.assign(b, &l, now)
	}
}

// deny sends b DENY_ALL for ttl, unless a DENY_ALL it was sent still holds; the
// proxy stops admitting under its assignment when it arrives.
func (st *quotaStream) deny(b *bucket, ttl time.Duration, now time.Time) {
	st.stopAt(b, now)
	if b.sent == sentDeny && now.Before(b.expires) {
		return
	}
	b.sent, b.expires = sentDeny, now.Add(ttl)
	st.send(b, ttl, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{
		BlanketRule: typev3.RateLimitStrategy_DENY_ALL}})
	st.q.m.assignments.WithLabelValues("deny_all").Inc()
}

// stopAt marks b's live assignment as replaced at now.
func (st *quotaStream) stopAt(b *bucket, now time.Time) {
	if n := len(b.open); n > 0 && b.open[n-1].stop.After(now) {
		b.open[n-1].stop = now
	}
}

// assign sends b a token bucket assignment of lease l: its worst case, max_tokens +
// tokens_per_fill x its life / fill_interval (bucketStrategy), is l's units.
func (st *quotaStream) assign(b *bucket, l *checks.Lease, now time.Time) {
	st.stopAt(b, now)
	strategy, life := bucketStrategy(l.Units, l.TTL, b.fill)
	b.fill = strategy.GetTokenBucket().GetFillInterval().AsDuration()
	b.open = append(b.open, &assignment{id: l.ID, amount: l.Units, stop: now.Add(life),
		forget: now.Add(l.TTL + leaseGrace - st.q.lim.ReportLag)})
	st.q.m.outstanding.Add(float64(l.Units))
	b.sent, b.expires = sentTokens, now.Add(l.TTL)
	b.due = now.Add(l.TTL * 3 / 4) // renewed ahead while it has traffic
	st.send(b, l.TTL, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: strategy.GetTokenBucket()}})
	st.q.m.assignments.WithLabelValues("token_bucket").Inc()
}

// bucketStrategy is the token bucket of a lease of units for ttl, and the life its
// worst case is reckoned over: ttl and a slack (a quarter, at least 50 ms) for the
// proxy's timers. Envoy's bucket starts full and refills continuously, so over a life
// T it admits at most max_tokens + tokens_per_fill x T / fill_interval. Three quarters
// of the units (rounded up) are max_tokens, so a proxy starved before its renewal has
// admitted most of its lease, and the rest refill over the life with slack; with none
// to refill, tokens_per_fill is 1 over twice that, so the refill stays below one
// token. A reassignment identical to the one before would be extended by the proxy
// with the tokens it holds (at most max_tokens, which the new lease covers too); its
// fill_interval is made to differ from prev's, so the proxy always starts it anew and
// never holds it past its TTL.
func bucketStrategy(units int64, ttl, prev time.Duration) (*typev3.RateLimitStrategy, time.Duration) {
	life := ttl + max(ttl/4, 50*time.Millisecond)
	full := (units*3 + 3) / 4
	refill := units - full
	fill := life
	perFill := refill
	if refill == 0 {
		perFill, fill = 1, 2*life
	}
	fill = fill.Truncate(time.Millisecond) + time.Millisecond // at least life: never more refill
	if fill == prev {
		fill += time.Millisecond
	}
	tb := &typev3.TokenBucket{MaxTokens: uint32(min(full, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(perFill, math.MaxUint32))), FillInterval: durationpb.New(fill)}
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: tb}}, life
}

// send queues b's assignment for the next message.
func (st *quotaStream) send(b *bucket, ttl time.Duration, s *typev3.RateLimitStrategy) {
	st.out = append(st.out, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s}}})
}

// flush sends the queued assignments in one message.
func (st *quotaStream) flush() error {
	if len(st.out) == 0 {
		return nil
	}
	err := st.stream.Send(&rlqsv3.RateLimitQuotaResponse{BucketAction: st.out})
	st.out = nil
	return err
}

// end settles what the stream's reports covered; every other open assignment is left
// to its lease's expiry, counted whole: the proxy may go on admitting under it (Envoy
// keeps its assignments while it reconnects), and nothing reported says otherwise.
func (st *quotaStream) end() {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(st.ctx), settleTimeout)
	defer cancel()
	for _, b := range st.buckets {
		for _, a := range b.open {
			if a.stop.Add(st.q.lim.ReportLag).Before(st.reported) {
				st.commit(ctx, a)
			} else {
				st.lose(a)
			}
		}
		b.open = nil
	}
	st.q.m.buckets.Sub(float64(len(st.buckets)))
}

// bucketKey names a bucket id by its entries in key order (Envoy's ids are maps: the
// order of their keys does not matter).
func bucketKey(id *rlqsv3.BucketId) string {
	es := id.GetBucket()
	var b strings.Builder
	for _, k := range sortedKeys(es) {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(es[k])
		b.WriteByte(0)
	}
	return b.String()
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
