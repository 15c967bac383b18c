package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// ModeRLQS: N simulated Envoy proxies (Proxy: the worst case every assignment allows)
// on the api's rate limit quota service, each watching buckets of its org's users,
// offered by Zipf's law; then ShouldRateLimit over the same time, for the figures side
// by side: what is admitted per server message and per second of the server's CPU
// (RunRLQS).
const ModeRLQS = "rlqs"

// RLQSConfig is what a run of ModeRLQS adds to Config (whose Duration, Concurrency,
// GRPCAddr and orgs it uses; Rate is the total offered to the proxies).
type RLQSConfig struct {
	Proxies  int           // simulated proxies, on the orgs round robin (default 4)
	Buckets  int           // buckets each watches (default 100): its org's users by rank
	Zipf     float64       // the bucket of rank k is offered a share of 1/k^Zipf (default DefaultZipfS)
	Interval time.Duration // each proxy's reporting interval (default 1 s, Envoy's usual)
	// MetricsURL is the api's Prometheus endpoint (QUOTA_METRICS_ADDR's /metrics): its
	// process_cpu_seconds_total before and after each phase is the server's CPU; ""
	// measures none.
	MetricsURL string
}

// RLQSReport is a ModeRLQS run: the proxies' phase and ShouldRateLimit's.
type RLQSReport struct {
	Proxies, Buckets int
	Zipf             float64
	Offered          int64   `json:"offered"`
	Admitted         int64   `json:"admitted"`
	Seconds          float64 `json:"seconds"`
	Reports          int     `json:"reports"`   // messages the proxies sent
	Responses        int     `json:"responses"` // messages the server sent
	TokenBuckets     int     `json:"token_bucket_assignments"`
	Actions          int     `json:"actions"`
	CPUSeconds       float64 `json:"server_cpu_seconds"` // 0: not measured
	// ShouldRateLimit's phase: calls (one message each way) and allowed.
	RLS        Report  `json:"should_rate_limit"`
	RLSCPU     float64 `json:"should_rate_limit_server_cpu_seconds"`
	Faults     []string
	StreamErrs []string
}

// PerMessage is what the proxies admitted per message the server received or sent.
func (r RLQSReport) PerMessage() float64 {
	return float64(r.Admitted) / float64(max(r.Reports+r.Responses, 1))
}

// Text writes the report.
func (r RLQSReport) Text(w io.Writer) {
	fmt.Fprintf(w, "rlqs       %d proxies x %d buckets (Zipf %.2f) for %.1fs: offered %d, admitted %d (%.0f/s) from %d token bucket assignments (%d actions)\n",
		r.Proxies, r.Buckets, r.Zipf, r.Seconds, r.Offered, r.Admitted, float64(r.Admitted)/r.Seconds, r.TokenBuckets, r.Actions)
	fmt.Fprintf(w, "           server messages %d (reports %d, responses %d): %.1f admitted per message\n",
		r.Reports+r.Responses, r.Reports, r.Responses, r.PerMessage())
	fmt.Fprintf(w, "grpc rls   %d ShouldRateLimit calls in %.1fs (%.0f/s), %d allowed: %.1f allowed per message (2 a call)\n",
		r.RLS.Requests, r.RLS.Seconds, r.RLS.RPS, r.RLS.Allowed, float64(r.RLS.Allowed)/float64(max(2*r.RLS.Requests, 1)))
	if r.CPUSeconds > 0 && r.RLSCPU > 0 {
		rlqs, rls := float64(r.Admitted)/r.CPUSeconds, float64(r.RLS.Allowed)/r.RLSCPU
		fmt.Fprintf(w, "per core   rlqs %.0f admitted per server CPU second (%.2f s), ShouldRateLimit %.0f allowed (%.0f calls) per server CPU second (%.2f s): %.1fx\n",
			rlqs, r.CPUSeconds, rls, float64(r.RLS.Requests)/r.RLSCPU, r.RLSCPU, rlqs/rls)
	} else {
		fmt.Fprintln(w, "per core   not measured (no -metrics-url)")
	}
	for _, f := range append(r.Faults, r.StreamErrs...) {
		fmt.Fprintf(w, "fault      %s\n", f)
	}
}

// RunRLQS runs ModeRLQS: cfg.Duration of the proxies offering cfg.Rate requests a
// second in all, then as long of ShouldRateLimit (Run with cfg.GRPCAddr), reading the
// server's CPU around each.
func RunRLQS(ctx context.Context, cfg Config, rc RLQSConfig, orgs []Org) (RLQSReport, error) {
	if err := cfg.defaults(); err != nil {
		return RLQSReport{}, err
	}
	if cfg.GRPCAddr == "" || len(orgs) == 0 {
		return RLQSReport{}, errors.New("loadgen: -mode rlqs needs -grpc and at least one org")
	}
	if rc.Proxies <= 0 {
		rc.Proxies = 4
	}
	if rc.Buckets <= 0 {
		rc.Buckets = 100
	}
	if rc.Zipf <= 0 {
		rc.Zipf = DefaultZipfS
	}
	if rc.Interval <= 0 {
		rc.Interval = time.Second
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 10000
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 10 * time.Second
	}
	conn, err := grpc.NewClient(cfg.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return RLQSReport{}, fmt.Errorf("loadgen: gRPC %s: %w", cfg.GRPCAddr, err)
	}
	defer conn.Close()
	rep := RLQSReport{Proxies: rc.Proxies, Buckets: rc.Buckets, Zipf: rc.Zipf}
	shares := zipfShares(rc.Buckets, rc.Zipf)
	cpu0, err := serverCPU(ctx, rc.MetricsURL)
	if err != nil {
		return rep, err
	}
	start := time.Now()
	var ps []*Proxy
	for i := range rc.Proxies {
		o := &orgs[i%len(orgs)]
		bs := make([]ProxyBucket, rc.Buckets)
		for k := range bs {
			team, user := o.rank(k) // ModeZipf's order of an org's paths
			bs[k] = ProxyBucket{ID: map[string]string{"team": team, "user": user}, Rate: cfg.Rate / float64(rc.Proxies) * shares[k]}
		}
		p, err := StartProxy(conn, o.Key, rc.Interval, bs)
		if err != nil {
			return rep, err
		}
		defer p.Cut()
		ps = append(ps, p)
	}
	select {
	case <-ctx.Done():
	case <-time.After(cfg.Duration):
	}
	for _, p := range ps {
		p.StopOffering()
	}
	rep.Seconds = time.Since(start).Seconds()
	time.Sleep(rc.Interval + 500*time.Millisecond) // the last reports settle every assignment
	for _, p := range ps {
		p.Cut()
		s := p.Stats()
		rep.Offered += s.Offered
		rep.Admitted += s.Admitted
		rep.Reports += s.Reports
		rep.Responses += s.Messages
		rep.TokenBuckets += s.TokenBuckets
		rep.Actions += s.Actions
		rep.Faults = append(rep.Faults, s.Faults...)
		if s.Err != nil && !strings.Contains(s.Err.Error(), "context canceled") {
			rep.StreamErrs = append(rep.StreamErrs, s.Err.Error())
		}
	}
	cpu1, err := serverCPU(ctx, rc.MetricsURL)
	if err != nil {
		return rep, err
	}
	rep.CPUSeconds = cpu1 - cpu0
	cfg.Mode, cfg.Rate, cfg.Batch, cfg.Progress = ModeCheck, 0, 0, nil
	if rep.RLS, err = Run(ctx, cfg, orgs); err != nil {
		return rep, err
	}
	cpu2, err := serverCPU(ctx, rc.MetricsURL)
	if err != nil {
		return rep, err
	}
	rep.RLSCPU = cpu2 - cpu1
	return rep, nil
}

// zipfShares is the share of the traffic of each of n ranks under Zipf's law of
// exponent s: 1/k^s, normalized.
func zipfShares(n int, s float64) []float64 {
	out := make([]float64, n)
	var sum float64
	for k := range out {
		out[k] = 1 / math.Pow(float64(k+1), s)
		sum += out[k]
	}
	for k := range out {
		out[k] /= sum
	}
	return out
}

// serverCPU reads process_cpu_seconds_total from the api's Prometheus endpoint; 0
// when url is "".
func serverCPU(ctx context.Context, url string) (float64, error) {
	if url == "" {
		return 0, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("loadgen: the api's metrics: %w", err)
	}
	defer res.Body.Close()
	return CPUSeconds(res.Body)
}

// CPUSeconds reads process_cpu_seconds_total from Prometheus text.
func CPUSeconds(r io.Reader) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_cpu_seconds_total "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("loadgen: the api's metrics have no process_cpu_seconds_total")
}
