package loadgen

import (
	"context"
	"fmt"
	"sync"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Proxy is Envoy's rate_limit_quota filter at its worst for a quota, on
// go-control-plane's generated RLQS client: it admits all an assignment allows (a
// fresh full token bucket on every assignment, refilled continuously, for its whole
// TTL from its arrival; nothing before the first assignment or after one expires, as
// no_assignment_behavior and expired_assignment_behavior DENY_ALL), offers each bucket
// its rate, and reports every interval what it admitted and denied. internal/rls's
// tests and the load tool's -mode rlqs drive the service with it.
type Proxy struct {
	stream   grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse]
	cancel   context.CancelFunc
	interval time.Duration
	done     chan struct{}
	wg       sync.WaitGroup

	mu       sync.Mutex
	buckets  []*proxyBucket
	byKey    map[string]*proxyBucket
	offering bool
	reported time.Time // last report sent
	reports  int       // report messages sent
	messages int       // messages received
	actions  int       // bucket actions received
	err      error     // the stream's end
	faults   []string  // actions the filter could not apply
}

// ProxyBucket is a bucket a Proxy watches: its id and the requests a second offered.
type ProxyBucket struct {
	ID   map[string]string
	Rate float64
}

// Assignment is an assignment as a Proxy received it.
type Assignment struct {
	At, End  time.Time // received; its TTL's end, or its replacement
	Replaced bool      // End is its replacement's arrival
	TTL      time.Duration
	Worst    float64 // the most it can admit: max_tokens + the refill over its TTL
	Deny     bool    // DENY_ALL
}

type proxyBucket struct {
	ProxyBucket
	deny, live      bool
	tokens, max     float64
	perSecond       float64
	last, expires   time.Time
	allowed, denied uint64 // since the last report
	admitted        int64
	offered         float64
	assignments     []Assignment
}

// StartProxy opens a stream on conn with key in its metadata ("" for none), sends the
// first report (it subscribes every bucket), and offers and reports every interval
// until Cut.
func StartProxy(conn grpc.ClientConnInterface, key string, interval time.Duration, buckets []ProxyBucket) (*Proxy, error) {
	ctx, cancel := context.WithCancel(context.Background())
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
	}
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	p := &Proxy{stream: stream, cancel: cancel, interval: interval, done: make(chan struct{}),
		byKey: map[string]*proxyBucket{}, offering: true}
	for _, b := range buckets {
		pb := &proxyBucket{ProxyBucket: b}
		p.buckets = append(p.buckets, pb)
		p.byKey[idKey(b.ID)] = pb
	}
	p.report()
	start := time.Now()
	p.wg.Add(3)
	go p.recv()
	go p.every(time.Millisecond, func() { p.offer(start) })
	go p.every(interval, p.report)
	return p, nil
}

func idKey(id map[string]string) string { return fmt.Sprint(id) } // fmt sorts map keys

func (p *Proxy) recv() {
	defer p.wg.Done()
	for {
		m, err := p.stream.Recv()
		if err != nil {
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
			return
		}
		now := time.Now()
		p.mu.Lock()
		p.messages++
		for _, a := range m.GetBucketAction() {
			p.actions++
			p.apply(a, now)
		}
		p.mu.Unlock()
	}
}

// apply applies action a as the filter does, at its worst: a token bucket starts full.
func (p *Proxy) apply(a *rlqsv3.RateLimitQuotaResponse_BucketAction, now time.Time) {
	b := p.byKey[idKey(a.GetBucketId().GetBucket())]
	qa := a.GetQuotaAssignmentAction()
	if b == nil || qa == nil {
		p.faults = append(p.faults, fmt.Sprintf("an action for no bucket of the proxy: %v", a))
		return
	}
	b.refill(now)
	if n := len(b.assignments); n > 0 && b.assignments[n-1].End.After(now) {
		b.assignments[n-1].End, b.assignments[n-1].Replaced = now, true
	}
	ttl := qa.GetAssignmentTimeToLive().AsDuration()
	b.live, b.expires, b.last = true, now.Add(ttl), now
	s := qa.GetRateLimitStrategy()
	if tb := s.GetTokenBucket(); tb != nil {
		b.deny = false
		b.max = float64(tb.GetMaxTokens())
		b.tokens = b.max // a fresh full bucket, even when the strategy is the same
		b.perSecond = float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
		b.assignments = append(b.assignments, Assignment{At: now, End: now.Add(ttl), TTL: ttl, Worst: b.max + b.perSecond*ttl.Seconds()})
		return
	}
	if s.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		p.faults = append(p.faults, fmt.Sprintf("assignment %v: want a token bucket or DENY_ALL", s))
	}
	b.deny = true
	b.assignments = append(b.assignments, Assignment{At: now, End: now.Add(ttl), Deny: true})
}

func (b *proxyBucket) refill(now time.Time) {
	if b.live && !b.deny {
		b.tokens = min(b.max, b.tokens+b.perSecond*now.Sub(b.last).Seconds())
	}
	b.last = now
}

// every runs f every d until the proxy is cut.
func (p *Proxy) every(d time.Duration, f func()) {
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

// offer offers each bucket its rate since start, admitting what its assignment lets.
func (p *Proxy) offer(start time.Time) {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.offering {
		return
	}
	for _, b := range p.buckets {
		for due := b.Rate * now.Sub(start).Seconds(); b.offered < due; b.offered++ {
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
func (p *Proxy) report() {
	p.mu.Lock()
	now := time.Now()
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "quotaplane"}
	var elapsed time.Duration
	if !p.reported.IsZero() {
		elapsed = now.Sub(p.reported)
	}
	for _, b := range p.buckets {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqsv3.BucketId{Bucket: b.ID}, TimeElapsed: durationpb.New(elapsed),
			NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied})
		b.allowed, b.denied = 0, 0
	}
	p.reported = now
	p.reports++
	p.mu.Unlock()
	_ = p.stream.Send(m)
}

// StopOffering stops the traffic; the proxy goes on reporting.
func (p *Proxy) StopOffering() {
	p.mu.Lock()
	p.offering = false
	p.mu.Unlock()
}

// Cut ends the proxy at once, without a last report.
func (p *Proxy) Cut() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	p.cancel()
	p.wg.Wait()
}

// ProxyStats is what a Proxy did.
type ProxyStats struct {
	Admitted, Offered     int64
	TokenBuckets, Actions int // token bucket assignments, all actions received
	Reports, Messages     int // messages sent, received
	Err                   error
	Faults                []string
}

// Stats is what the proxy did so far.
func (p *Proxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := ProxyStats{Actions: p.actions, Reports: p.reports, Messages: p.messages, Err: p.err, Faults: p.faults}
	for _, b := range p.buckets {
		s.Admitted += b.admitted
		s.Offered += int64(b.offered)
		for _, a := range b.assignments {
			if !a.Deny {
				s.TokenBuckets++
			}
		}
	}
	return s
}

// Bucket is the assignments bucket id received and what it admitted.
func (p *Proxy) Bucket(id map[string]string) ([]Assignment, int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.byKey[idKey(id)]
	if b == nil {
		return nil, 0
	}
	return append([]Assignment(nil), b.assignments...), b.admitted
}

// Unreported is the most the proxy may have admitted under assignments a server could
// not have settled by its last report: those that ended (replaced, or expired with the
// slack internal/rls reckons, a quarter of the TTL and at least 50 ms) less than lag
// and an interval before it, or not at all.
func (p *Proxy) Unreported(lag time.Duration) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var w float64
	for _, b := range p.buckets {
		for _, a := range b.assignments {
			end := a.End
			if !a.Replaced {
				end = a.At.Add(a.TTL + max(a.TTL/4, 50*time.Millisecond))
			}
			if !a.Deny && end.Add(lag+p.interval).After(p.reported) {
				w += a.Worst
			}
		}
	}
	return w
}
