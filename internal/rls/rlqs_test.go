package rls_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// The proxies below are Envoy's rate_limit_quota filter at its worst for a quota: on
// go-control-plane's generated RLQS client, each admits all an assignment allows (a
// fresh full bucket on every assignment, refilled continuously, for its whole TTL from
// its arrival, and nothing before the first or after expiry: no_assignment_behavior
// and expired_assignment_behavior deny), offering its rate to each bucket, and
// reports every interval what it admitted and denied.

const simInterval = 100 * time.Millisecond

// simAssignment is an assignment as a proxy received it.
type simAssignment struct {
	at, end time.Time // received; its TTL's end (or its replacement)
	worst   float64   // the most it can admit: max_tokens + refill over its TTL
	deny    bool
}

// simBucket is one bucket of a proxy.
type simBucket struct {
	id              map[string]string
	deny, live      bool
	tokens, max     float64
	perSecond       float64
	last, expires   time.Time
	allowed, denied uint64 // since the last report
	admitted        int64
	assignments     []simAssignment
	offered         float64
}

// proxy is one simulated Envoy.
type proxy struct {
	t        *testing.T
	rate     float64 // offered per bucket, a second
	stream   grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel   context.CancelFunc
	mu       sync.Mutex
	buckets  []*simBucket
	reported time.Time // last report sent
	received int       // bucket actions received
	done     chan struct{}
	wg       sync.WaitGroup
	recvErr  error
}

// startProxy opens a stream with key and watches buckets, offering rate requests a
// second to each.
func startProxy(t *testing.T, r *replica, key string, rate float64, buckets ...map[string]string) *proxy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
	}
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(r.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, rate: rate, stream: stream, cancel: cancel, done: make(chan struct{})}
	for _, id := range buckets {
		p.buckets = append(p.buckets, &simBucket{id: id})
	}
	p.report() // the first report subscribes every bucket
	p.wg.Add(3)
	start := time.Now()
	go p.recv()
	go p.every(time.Millisecond, func() { p.offer(start) })
	go p.every(simInterval, p.report)
	t.Cleanup(p.cut)
	return p
}

func (p *proxy) bucketOf(id map[string]string) *simBucket {
	for _, b := range p.buckets {
		if fmt.Sprint(b.id) == fmt.Sprint(id) {
			return b
		}
	}
	return nil
}

func (p *proxy) recv() {
	defer p.wg.Done()
	for {
		m, err := p.stream.Recv()
		if err != nil {
			p.mu.Lock()
			p.recvErr = err
			p.mu.Unlock()
			return
		}
		now := time.Now()
		p.mu.Lock()
		for _, a := range m.GetBucketAction() {
			p.received++
			b := p.bucketOf(a.GetBucketId().GetBucket())
			qa := a.GetQuotaAssignmentAction()
			if b == nil || qa == nil {
				p.t.Errorf("an action for no bucket of the proxy: %v", a)
				continue
			}
			b.refill(now)
			if n := len(b.assignments); n > 0 && b.assignments[n-1].end.After(now) {
				b.assignments[n-1].end = now
			}
			ttl := qa.GetAssignmentTimeToLive().AsDuration()
			b.live, b.expires, b.last = true, now.Add(ttl), now
			s := qa.GetRateLimitStrategy()
			if tb := s.GetTokenBucket(); tb != nil {
				b.deny = false
				b.max = float64(tb.GetMaxTokens())
				b.tokens = b.max // a fresh full bucket, even when the strategy is the same
				b.perSecond = float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
				b.assignments = append(b.assignments, simAssignment{at: now, end: now.Add(ttl), worst: b.max + b.perSecond*ttl.Seconds()})
			} else {
				if s.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
					p.t.Errorf("assignment %v: want a token bucket or DENY_ALL", s)
				}
				b.deny = true
				b.assignments = append(b.assignments, simAssignment{at: now, end: now.Add(ttl), deny: true})
			}
		}
		p.mu.Unlock()
	}
}

func (b *simBucket) refill(now time.Time) {
	if b.live && !b.deny {
		b.tokens = min(b.max, b.tokens+b.perSecond*now.Sub(b.last).Seconds())
	}
	b.last = now
}

// every runs f every d until the proxy stops.
func (p *proxy) every(d time.Duration, f func()) {
	defer p.wg.Done()
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-tick.C:
			f()
		}
	}
}

// offer offers the proxy's rate of requests a second to each bucket since start.
func (p *proxy) offer(start time.Time) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.buckets {
		due := p.rate * now.Sub(start).Seconds()
		for ; b.offered < due; b.offered++ {
			if !b.live || b.deny || now.After(b.expires) {
				b.denied++
				continue
			}
			b.refill(now)
			if b.tokens >= 1 {
				b.tokens--
				b.allowed++
				b.admitted++
			} else {
				b.denied++
			}
		}
	}
}

// report sends every bucket's usage since the last report.
func (p *proxy) report() {
	p.mu.Lock()
	now := time.Now()
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
	elapsed := now.Sub(p.reported)
	if p.reported.IsZero() {
		elapsed = 0
	}
	for _, b := range p.buckets {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: b.id}, TimeElapsed: durationpb.New(elapsed),
			NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied})
		b.allowed, b.denied = 0, 0
	}
	p.reported = now
	p.mu.Unlock()
	_ = p.stream.Send(m)
}

// stopOffering stops admitting; the proxy goes on reporting (zeros).
func (p *proxy) stopOffering() {
	p.mu.Lock()
	p.rate = 0
	p.mu.Unlock()
}

// cut ends the proxy at once, without a last report.
func (p *proxy) cut() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	p.cancel()
	p.wg.Wait()
}

// admitted is what the proxy admitted in all.
func (p *proxy) admitted() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, b := range p.buckets {
		n += b.admitted
	}
	return n
}

// tokenAssignments is how many token bucket assignments the proxy received.
func (p *proxy) tokenAssignments() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, b := range p.buckets {
		for _, a := range b.assignments {
			if !a.deny {
				n++
			}
		}
	}
	return n
}

// unreported is the most the proxy may have admitted under assignments the server
// could not have settled by its last report: those live at its last report or ended
// less than the report lag (and a report interval) before it.
func (p *proxy) unreported(lag time.Duration) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var w float64
	for _, b := range p.buckets {
		for _, a := range b.assignments {
			if !a.deny && a.end.Add(lag+simInterval).After(p.reported) {
				w += a.worst
			}
		}
	}
	return w
}

// setupRLQS creates an org whose users may use userMonth requests a month, and whose
// team eng has teamMinute a minute when not 0, and returns a key with the check scope.
func setupRLQS(r *replica, org string, userMonth, teamMinute int) string {
	r.mustDo("POST", "/v1/plans", `{"id":"p-`+org+`","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":1000000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	team := ""
	if teamMinute > 0 {
		team = fmt.Sprintf(`"limits":[{"metric":"requests","window":"minute","limit":%d}],`, teamMinute)
	}
	r.mustDo("POST", "/v1/orgs/"+org+"/teams", fmt.Sprintf(`{"id":"eng","name":"T",%s"user_limits":[{"metric":"requests","window":"month","limit":%d}]}`, team, userMonth), 201)
	return r.key(org, `"check"`)
}

// runUntilStill lets the proxies run until none admitted anything for quiet (at most
// max), then stops their offering and lets them report for a while more.
func runUntilStill(ps []*proxy, quiet, max time.Duration) {
	start, last, lastN := time.Now(), time.Now(), int64(-1)
	for time.Since(start) < max {
		time.Sleep(20 * time.Millisecond)
		var n int64
		for _, p := range ps {
			n += p.admitted()
		}
		if n != lastN {
			last, lastN = time.Now(), n
		} else if time.Since(last) > quiet {
			break
		}
	}
	for _, p := range ps {
		p.stopOffering()
	}
	time.Sleep(500 * time.Millisecond) // reports cover every assignment's end
}

// gauge reads a metric's value from reg (a counter or a gauge; labels summed).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v
}

// Three proxies on one user's month limit of 1,000, each offering 2,000 requests a
// second: together they admit between 950 and 1,000, never more, and what is counted
// is what they admitted (each reported every assignment's end) to within what the
// streams left unreported (quotaplane_rlqs_lost_units_total).
func TestRLQSThreeProxiesShareAMonthLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{grpcReg: reg})
	key := setupRLQS(r, "acme", 1000, 0)
	bucket := map[string]string{"team": "eng", "x-user-id": "alice"} // an alias, as descriptors have
	var ps []*proxy
	for range 3 {
		ps = append(ps, startProxy(t, r, key, 2000, bucket))
	}
	runUntilStill(ps, 2*time.Second, 20*time.Second)
	var admitted int64
	sent := 0
	for i, p := range ps {
		admitted += p.admitted()
		sent += p.tokenAssignments()
		t.Logf("proxy %d admitted %d from %d token bucket assignments (%d actions)", i, p.admitted(), p.tokenAssignments(), p.received)
	}
	all := gauge(t, reg, "quotaplane_rlqs_assignments_total")
	counted := r.used(key, "acme", "eng", "alice")
	lost := gauge(t, reg, "quotaplane_rlqs_lost_units_total")
	t.Logf("admitted %d, counted %d, assignments sent %d (%d token buckets), lost %.0f", admitted, counted, int(all), sent, lost)
	if admitted > 1000 || admitted < 950 {
		t.Errorf("admitted %d, want 950 to 1000", admitted)
	}
	if counted < admitted || float64(counted-admitted) > lost {
		t.Errorf("counted %d of %d admitted, want at least what was admitted and at most %.0f more", counted, admitted, lost)
	}
	if int64(all) > admitted/5 {
		t.Errorf("%d assignments sent for %d admitted, want at most admitted / 5", int(all), admitted)
	}
}

// A proxy cut mid-run without a last report: the proxies never admit past the limit,
// and what is counted past what they admitted is within the cut proxy's assignments
// the server could not settle (live at its last report or ending within the report
// lag of it).
func TestRLQSProxyCutWithoutAReport(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{grpcReg: reg})
	key := setupRLQS(r, "acme", 1000, 0)
	bucket := map[string]string{"team": "eng", "user": "bob"}
	a := startProxy(t, r, key, 2000, bucket)
	b := startProxy(t, r, key, 500, bucket)
	time.Sleep(400 * time.Millisecond)
	a.cut()
	bound := a.unreported(250 * time.Millisecond)
	runUntilStill([]*proxy{b}, 2*time.Second, 20*time.Second)
	admitted := a.admitted() + b.admitted()
	counted := r.used(key, "acme", "eng", "bob")
	all := gauge(t, reg, "quotaplane_rlqs_assignments_total")
	t.Logf("admitted %d (cut proxy %d), counted %d, counted - admitted %d, the cut proxy's unsettled assignments %.0f, assignments sent %d, lost %.0f",
		admitted, a.admitted(), counted, counted-admitted, bound, int(all), gauge(t, reg, "quotaplane_rlqs_lost_units_total"))
	if admitted > 1000 {
		t.Errorf("admitted %d, past the limit of 1000", admitted)
	}
	if counted > 1000 || counted < admitted || float64(counted-admitted) > bound {
		t.Errorf("counted %d of %d admitted, want at least what was admitted and at most %.0f more", counted, admitted, bound)
	}
	if int64(all) > admitted/5 {
		t.Errorf("%d assignments sent for %d admitted, want at most admitted / 5", int(all), admitted)
	}
}

// A team's minute limit and a user's month limit decided together through RLQS:
// within one minute the proxies admit no more than the team's minute limit, nor the
// user's month.
func TestRLQSTeamMinuteAndUserMonth(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := setupRLQS(r, "acme", 1000, 300)
	// the run stays in one minute (LeaseEnd ends assignments with it)
	if s := time.Now().Second(); s > 45 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	minute := time.Now().Truncate(time.Minute)
	bucket := map[string]string{"team": "eng", "user": "carol"}
	var ps []*proxy
	for range 3 {
		ps = append(ps, startProxy(t, r, key, 2000, bucket))
	}
	runUntilStill(ps, time.Second, 8*time.Second)
	var admitted int64
	for _, p := range ps {
		admitted += p.admitted()
	}
	if time.Now().Truncate(time.Minute) != minute {
		t.Skip("the run crossed a minute; the bound is of one minute")
	}
	t.Logf("admitted %d in one minute: team minute limit 300, user month limit 1000; counted %d", admitted, r.used(key, "acme", "eng", "carol"))
	if admitted > 300 || admitted < 280 {
		t.Errorf("admitted %d in one minute, want 280 to 300 (the team's minute limit)", admitted)
	}
}

// Buckets that cannot be decided are DENY_ALL, counting nothing, while the stream's
// other buckets are decided; a stream without a key or with a wrong one is
// Unauthenticated.
func TestRLQSBadBucketsAndKeys(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := setupRLQS(r, "acme", 1000, 0)
	good := map[string]string{"team": "eng", "user": "dave"}
	bad := []map[string]string{
		{"team": "eng", "user": "not an id!"},
		{"team": "nope", "user": "dave"},
		{"org": "other", "user": "dave"},
		{"colour": "red"},
		{"team": "eng", "user": "dave", "x-user-id": "erin"},
	}
	p := startProxy(t, r, key, 50, append([]map[string]string{good}, bad...)...)
	time.Sleep(600 * time.Millisecond)
	p.cut()
	p.mu.Lock()
	for _, b := range p.buckets {
		kinds := []string{}
		for _, a := range b.assignments {
			kinds = append(kinds, map[bool]string{true: "deny", false: "tokens"}[a.deny])
		}
		isGood := fmt.Sprint(b.id) == fmt.Sprint(good)
		switch {
		case len(kinds) == 0:
			t.Errorf("bucket %v: no assignment", b.id)
		case isGood && (kinds[0] != "tokens" || b.admitted == 0):
			t.Errorf("bucket %v: %v, admitted %d; want token buckets", b.id, kinds, b.admitted)
		case !isGood && (strings.Contains(strings.Join(kinds, " "), "tokens") || b.admitted != 0):
			t.Errorf("bucket %v: %v, admitted %d; want DENY_ALL only", b.id, kinds, b.admitted)
		}
	}
	p.mu.Unlock()

	for _, k := range []string{"", "qp_live_wrongwrongwrongwrong"} {
		s := startProxy(t, r, k, 10, good)
		time.Sleep(100 * time.Millisecond)
		s.mu.Lock()
		err := s.recvErr
		s.mu.Unlock()
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("key %q: %v, want Unauthenticated", k, err)
		}
		s.cut()
	}
}
