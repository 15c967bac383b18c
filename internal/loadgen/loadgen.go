package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Config says what to provision and how to load it.
type Config struct {
	URL          string        // base URL of the api, e.g. http://127.0.0.1:8080
	AdminToken   string        // operator token, to provision
	Prefix       string        // ids start with it; reusing a prefix reuses what exists
	Orgs         int           // number of orgs
	Teams        int           // teams per org
	Users        int           // users per team (unregistered: they get the team's user defaults)
	UserMonth    int64         // month limit of each user (team user default)
	TeamMonth    int64         // month limit of each team
	OrgMonth     int64         // month limit of each org
	OrgPerMinute int64         // per-minute limit of each org (0: none)
	Concurrency  int           // connections
	Duration     time.Duration // how long to send
	Requests     int64         // stop after this many requests (0: no bound)
	Rate         float64       // requests per second over all connections (0: as fast as possible)
	Batch        int           // checks per request; 0 or 1 sends /v1/check
	// GRPCAddr, when set, sends each check as a ShouldRateLimit call to the api's
	// rate limit service there (host:port) instead of /v1/check; not with Batch.
	GRPCAddr string
	// GRPCPath, with GRPCAddr, sends what Envoy sends for an org -> team -> user path:
	// three descriptors, [org], [org, team] and [org, team, user], instead of one
	// [team, user].
	GRPCPath bool
	HotShare float64   // share of traffic to org 0 (0..1): a hot tenant
	Cost     int64     // units per check
	Progress io.Writer // one line a second; nil for none

	// Mode is what one request is: ModeCheck (""), ModeMulti or ModePairs (modes.go),
	// or ModeRLQS, run by RunRLQS (rlqs.go).
	// The plan provisioned carries what the mode needs: tokens limits for ModeMulti,
	// concurrent limits for ModePairs; give each mode its own Prefix.
	Mode   string
	Tokens int64 // ModeMulti: tokens per check, beside Cost requests (default 1000)
	// ModePairs: the concurrent limits of requests (defaults 8, 5, 3), and how long
	// each slot is held between its acquire and its release (default 0).
	OrgConcurrent, TeamConcurrent, UserConcurrent int64
	Hold                                          time.Duration
}

func (c *Config) defaults() error {
	if c.URL == "" || c.AdminToken == "" {
		return errors.New("loadgen: the api URL and the operator token are required")
	}
	set := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	set(&c.Orgs, 10)
	set(&c.Teams, 2)
	set(&c.Users, 5)
	set(&c.Concurrency, 50)
	if c.Prefix == "" {
		c.Prefix = "lg"
	}
	if c.UserMonth <= 0 {
		c.UserMonth = 50
	}
	if c.TeamMonth <= 0 {
		c.TeamMonth = int64(c.Users) * c.UserMonth * 4 / 5
	}
	if c.OrgMonth <= 0 {
		c.OrgMonth = int64(c.Teams) * c.TeamMonth * 4 / 5
	}
	if c.Cost <= 0 {
		c.Cost = 1
	}
	if c.Duration <= 0 && c.Requests <= 0 {
		c.Duration = 10 * time.Second
	}
	if c.Batch > 100 {
		return errors.New("loadgen: at most 100 checks per batch")
	}
	if c.GRPCAddr != "" && c.Batch > 1 {
		return errors.New("loadgen: batches go over HTTP; a gRPC call carries one check")
	}
	switch c.Mode {
	case "":
		c.Mode = ModeCheck
	case ModeCheck:
	case ModeMulti, ModePairs, ModeZipf:
		if c.GRPCAddr != "" || c.Batch > 1 {
			return errMode
		}
	case ModeRLQS: // provisioned as ModeCheck; RunRLQS needs GRPCAddr
	default:
		return fmt.Errorf("loadgen: mode %q: one of %s, %s, %s, %s, %s", c.Mode, ModeCheck, ModeMulti, ModePairs, ModeZipf, ModeRLQS)
	}
	if c.Tokens <= 0 {
		c.Tokens = 1000
	}
	if c.Hold < 0 || c.Hold >= time.Duration(pairTTL)*time.Second {
		return fmt.Errorf("loadgen: a slot is held under its ttl of %ds: hold %v", pairTTL, c.Hold)
	}
	conc := func(p *int64, v int64) {
		if *p <= 0 {
			*p = v
		}
	}
	conc(&c.OrgConcurrent, 8)
	conc(&c.TeamConcurrent, 5)
	conc(&c.UserConcurrent, 3)
	return nil
}

// Org is one provisioned org with the key its traffic uses.
type Org struct {
	ID    string
	Key   string
	Teams []string
}

// client talks JSON to the api, and gRPC to its rate limit service when rls is set.
type client struct {
	base string
	http *http.Client
	rls  []rlsv3.RateLimitServiceClient // one per connection; workers share them round robin
}

// dialRLS opens conns gRPC connections to addr (each multiplexes many calls).
func (c *client) dialRLS(addr string, conns int) (func(), error) {
	var closers []func() error
	for range conns {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, fmt.Errorf("loadgen: gRPC %s: %w", addr, err)
		}
		closers = append(closers, cc.Close)
		c.rls = append(c.rls, rlsv3.NewRateLimitServiceClient(cc))
	}
	return func() {
		for _, f := range closers {
			_ = f()
		}
	}, nil
}

func (c *client) do(ctx context.Context, method, path, token string, body any, out any) (int, error) {
	code, _, err := c.doWait(ctx, method, path, token, body, out)
	return code, err
}

// doWait is do that also returns a 429's Retry-After (1 s when absent or unusable).
func (c *client) doWait(ctx context.Context, method, path, token string, body any, out any) (int, time.Duration, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	wait := time.Second
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs >= 0 && secs <= 60 {
		wait = time.Duration(max(secs, 1)) * time.Second
	}
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, wait, err
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, wait, fmt.Errorf("%s %s: decode: %w", method, path, err)
		}
	}
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusConflict {
		return resp.StatusCode, wait, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(data))
	}
	return resp.StatusCode, wait, nil
}

// admin is do for the admin API, which is rate limited per credential
// (QUOTA_ADMIN_RATE_LIMIT): a 429 is waited out, as its Retry-After says, up to 20
// times. Checks never go through here: their 429 is a decision.
func (c *client) admin(ctx context.Context, method, path, token string, body any, out any) (int, error) {
	for attempt := 0; ; attempt++ {
		code, wait, err := c.doWait(ctx, method, path, token, body, out)
		if code != http.StatusTooManyRequests || attempt == 20 {
			return code, err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return code, ctx.Err()
		}
	}
}

func newClient(base string, conns int) *client {
	return &client{base: base, http: &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{MaxIdleConns: conns * 2, MaxIdleConnsPerHost: conns * 2, MaxConnsPerHost: conns}}}
}

// Provision creates (or, with an existing prefix, reuses) the plan, orgs and teams,
// and a fresh key with the check and billing scopes for each org. It works with 8
// requests in flight.
func Provision(ctx context.Context, cfg Config) ([]Org, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	c := newClient(cfg.URL, 8)
	limits := cfg.levelLimits("org")
	if cfg.OrgPerMinute > 0 {
		limits = append(limits, api.Limit{Metric: "requests", Window: vocab.Minute, Limit: cfg.OrgPerMinute})
	}
	plan := cfg.Prefix + "-plan"
	if code, err := c.admin(ctx, "POST", "/v1/plans", cfg.AdminToken, api.PlanCreate{Id: plan, Name: "loadgen",
		FailMode: vocab.FailClosed, Limits: limits}, nil); err != nil {
		if cfg.Mode == ModePairs && refusal(code) {
			return nil, &RefusedError{Mode: ModePairs, What: "a plan with a concurrent limit", Section: modeSection(ModePairs), Status: code, Err: err}
		}
		return nil, err
	}
	orgs := make([]Org, cfg.Orgs)
	errs := make(chan error, cfg.Orgs)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i := range orgs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			o, err := provisionOrg(ctx, c, cfg, plan, i)
			orgs[i] = o
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return orgs, nil
}

func provisionOrg(ctx context.Context, c *client, cfg Config, plan string, i int) (Org, error) {
	o := Org{ID: fmt.Sprintf("%s-org-%d", cfg.Prefix, i)}
	// The org oversubscribes (its teams add up to more than it has), so that under
	// load every level, the org's too, is where some checks stop.
	over := true
	if _, err := c.admin(ctx, "POST", "/v1/orgs", cfg.AdminToken, api.OrgCreate{Id: o.ID, Name: o.ID, Plan: plan, Oversubscribe: &over}, nil); err != nil {
		return o, err
	}
	for t := range cfg.Teams {
		team := fmt.Sprintf("t%d", t)
		limits, users := cfg.levelLimits("team"), cfg.levelLimits("user")
		if code, err := c.admin(ctx, "POST", "/v1/orgs/"+o.ID+"/teams", cfg.AdminToken,
			api.TeamCreate{Id: team, Name: team, Limits: &limits, UserLimits: &users}, nil); err != nil {
			if cfg.Mode == ModePairs && refusal(code) {
				return o, &RefusedError{Mode: ModePairs, What: "a team with concurrent limits", Section: modeSection(ModePairs), Status: code, Err: err}
			}
			return o, err
		}
		o.Teams = append(o.Teams, team)
	}
	var k api.ApiKeyCreated
	if _, err := c.admin(ctx, "POST", "/v1/orgs/"+o.ID+"/api-keys", cfg.AdminToken,
		api.ApiKeyCreate{Name: "loadgen", Scopes: []api.Scope{api.ScopeCheck, api.ScopeBilling}}, &k); err != nil {
		return o, err
	}
	o.Key = k.Secret
	return o, nil
}

// Report is what a run measured.
type Report struct {
	Requests    int64              `json:"requests"`
	Checks      int64              `json:"checks"`
	Allowed     int64              `json:"allowed"`
	Denied      int64              `json:"denied"`
	Errors      int64              `json:"errors"`
	Seconds     float64            `json:"seconds"`
	RPS         float64            `json:"requests_per_second"`
	ChecksPS    float64            `json:"checks_per_second"`
	LatencyMS   map[string]float64 `json:"latency_ms"` // p50, p90, p99, p99.9, max
	PerSecond   []Second           `json:"per_second"`
	OverAdmit   []string           `json:"over_admission"`         // empty when verified clean
	ErrorSample []string           `json:"error_sample,omitempty"` // the first few errors, as answered
	Verified    bool               `json:"verified"`
	VerifyNotes []string           `json:"verify_notes,omitempty"`

	// Mode is what one request was (Config.Mode). For ModePairs a "request" above is
	// one acquire+release pair (two HTTP requests), Checks counts the acquires and
	// Allowed the slots held; PairsPS is RPS again, named.
	Mode        string           `json:"mode"`
	Metrics     []string         `json:"metrics,omitempty"` // ModeMulti: the metrics of each check's costs
	PairsPS     float64          `json:"pairs_per_second,omitempty"`
	MaxInFlight map[string]int64 `json:"max_in_flight,omitempty"` // ModePairs: the most slots held at once at any org, team, user, as the answers show
	// Refused is set when the api does not take the mode's requests (RefusedError):
	// nothing was measured.
	Refused string `json:"refused,omitempty"`
}

// Second is one second of the run.
type Second struct {
	T        int     `json:"t"`
	Requests int64   `json:"requests"`
	P50MS    float64 `json:"p50_ms"`
	P99MS    float64 `json:"p99_ms"`
}

// tally counts allowed checks per level, to compare with the limits and usage.
type tally struct {
	mu   sync.Mutex
	errs []string
	org  map[string]int64
	team map[[2]string]int64
	user map[[3]string]int64
	// tokens is the same for the second metric of ModeMulti; inflight the slots held
	// in ModePairs.
	tokens   *tally
	inflight inFlight
}

func newTally() *tally {
	return &tally{org: map[string]int64{}, team: map[[2]string]int64{}, user: map[[3]string]int64{}}
}

// fail remembers the first few errors for the report.
func (t *tally) fail(err error) {
	t.mu.Lock()
	if len(t.errs) < 5 {
		t.errs = append(t.errs, err.Error())
	}
	t.mu.Unlock()
}

func (t *tally) add(org, team, user string, units int64) {
	t.mu.Lock()
	t.org[org] += units
	t.team[[2]string{org, team}] += units
	t.user[[3]string{org, team, user}] += units
	t.mu.Unlock()
}

type target struct {
	org  *Org
	team string
	user string
}

func pick(cfg *Config, orgs []Org, r *rand.Rand) target {
	o := &orgs[r.IntN(len(orgs))]
	if cfg.HotShare > 0 && r.Float64() < cfg.HotShare {
		o = &orgs[0]
	}
	return target{org: o, team: o.Teams[r.IntN(len(o.Teams))], user: fmt.Sprintf("u%d", r.IntN(cfg.Users))}
}

// Run sends the load and returns the report, verified against the usage API.
func Run(ctx context.Context, cfg Config, orgs []Org) (Report, error) {
	if err := cfg.defaults(); err != nil {
		return Report{}, err
	}
	if len(orgs) == 0 {
		return Report{}, errors.New("loadgen: no orgs to load")
	}
	c := newClient(cfg.URL, cfg.Concurrency)
	if cfg.GRPCAddr != "" {
		closeRLS, err := c.dialRLS(cfg.GRPCAddr, max(1, cfg.Concurrency/8))
		if err != nil {
			return Report{}, err
		}
		defer closeRLS()
	}
	tl := newTally()
	tl.tokens = newTally()
	var requests, checks, allowed, denied, errCount atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration // all latencies, for the final percentiles
	var window []time.Duration
	var seconds []Second

	// The run ends at its duration, or when the workers have sent their requests.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Duration > 0 {
		runCtx, cancel = context.WithTimeout(runCtx, cfg.Duration)
		defer cancel()
	}
	// A mode the api refuses ends the run at its first refusal.
	var refusedOnce sync.Once
	var refusedErr error
	refused := func(err error) {
		refusedOnce.Do(func() {
			refusedErr = err
			cancel()
		})
	}
	sendOne := modeSend(&cfg, c, ctx, orgs, tl, refused)
	unit := "req/s"
	if cfg.Mode == ModePairs {
		unit = "pairs/s"
	}
	var tick <-chan time.Time
	if cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
		defer t.Stop()
		tick = t.C
	}
	start := time.Now()
	progressDone := make(chan struct{})
	go func() { // one line a second
		defer close(progressDone)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		var last int64
		for s := 1; ; s++ {
			select {
			case <-runCtx.Done():
				return
			case <-t.C:
			}
			mu.Lock()
			w := window
			window = nil
			mu.Unlock()
			slices.Sort(w)
			sec := Second{T: s, Requests: requests.Load() - last, P50MS: pctMS(w, 0.5), P99MS: pctMS(w, 0.99)}
			last += sec.Requests
			seconds = append(seconds, sec)
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "t=%3ds  %7d %s  p50 %6.2f ms  p99 %6.2f ms  allowed %d  denied %d  errors %d\n",
					s, sec.Requests, unit, sec.P50MS, sec.P99MS, allowed.Load(), denied.Load(), errCount.Load())
			}
		}
	}()

	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			local := make([]time.Duration, 0, 4096)
			defer func() {
				mu.Lock()
				lat = append(lat, local...)
				mu.Unlock()
			}()
			for runCtx.Err() == nil {
				if n := requests.Add(1); cfg.Requests > 0 && n > cfg.Requests {
					return
				}
				if tick != nil {
					select {
					case <-tick:
					case <-runCtx.Done():
						return
					}
				}
				t0 := time.Now()
				a, d, e := sendOne(runCtx, r)
				el := time.Since(t0)
				if e > 0 && ended(runCtx) {
					return // cut off by the end of the run, not a server error
				}
				local = append(local, el)
				mu.Lock()
				window = append(window, el)
				mu.Unlock()
				allowed.Add(a)
				denied.Add(d)
				errCount.Add(e)
				checks.Add(a + d + e)
			}
		})
	}
	wg.Wait()
	cancel()
	<-progressDone
	elapsed := time.Since(start).Seconds()
	slices.Sort(lat)
	rep := Report{Requests: int64(len(lat)), Checks: checks.Load(), Allowed: allowed.Load(), Denied: denied.Load(),
		Errors: errCount.Load(), Seconds: elapsed, PerSecond: seconds,
		LatencyMS: map[string]float64{"p50": pctMS(lat, .5), "p90": pctMS(lat, .9), "p99": pctMS(lat, .99),
			"p99.9": pctMS(lat, .999), "max": pctMS(lat, 1)}}
	rep.ErrorSample = tl.errs
	rep.RPS = float64(rep.Requests) / elapsed
	rep.ChecksPS = float64(rep.Checks) / elapsed
	rep.Mode = cfg.Mode
	if refusedErr != nil {
		rep.Refused = refusedErr.Error()
		return rep, refusedErr
	}
	switch cfg.Mode {
	case ModeMulti:
		rep.Metrics = []string{metricRequests, metricTokens}
	case ModePairs:
		rep.PairsPS = rep.RPS
	}
	verify(ctx, c, &cfg, orgs, tl, &rep)
	if cfg.Mode == ModePairs {
		verifyPairs(ctx, c, &cfg, orgs, tl, &rep)
		rep.Verified = len(rep.OverAdmit) == 0
	}
	return rep, nil
}

func pctMS(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(p*float64(len(sorted))))
	return float64(sorted[i].Microseconds()) / 1000
}

// send makes one request (one check, or a batch to one org) and counts its answers.
func send(ctx context.Context, c *client, cfg *Config, orgs []Org, r *rand.Rand, tl *tally) (allowed, denied, errs int64) {
	if len(c.rls) > 0 {
		return sendGRPC(ctx, c.rls[r.IntN(len(c.rls))], cfg, pick(cfg, orgs, r), tl)
	}
	if cfg.Batch <= 1 {
		t := pick(cfg, orgs, r)
		body := api.CheckRequest{Org: t.org.ID, Team: &t.team, User: &t.user, Cost: &cfg.Cost}
		var res api.CheckResult
		code, err := c.do(ctx, "POST", "/v1/check", t.org.Key, body, &res)
		switch {
		case code == http.StatusOK && res.Allowed:
			tl.add(t.org.ID, t.team, t.user, cfg.Cost)
			return 1, 0, 0
		case code == http.StatusTooManyRequests:
			return 0, 1, 0
		case err != nil || code != http.StatusOK:
			if err == nil {
				err = fmt.Errorf("/v1/check: status %d", code)
			}
			if ctx.Err() == nil {
				tl.fail(err)
			}
			return 0, 0, 1
		}
		return 0, 1, 0
	}
	first := pick(cfg, orgs, r) // a batch carries checks of one org: one key
	targets := make([]target, cfg.Batch)
	req := api.BatchCheckRequest{Checks: make([]api.CheckRequest, cfg.Batch)}
	for i := range targets {
		t := pick(cfg, []Org{*first.org}, r)
		targets[i] = t
		req.Checks[i] = api.CheckRequest{Org: first.org.ID, Team: &t.team, User: &t.user, Cost: &cfg.Cost}
	}
	var out struct {
		Results []struct {
			Allowed *bool  `json:"allowed"`
			Detail  string `json:"detail"`
		} `json:"results"`
	}
	code, err := c.do(ctx, "POST", "/v1/check/batch", first.org.Key, req, &out)
	if err != nil || code != http.StatusOK || len(out.Results) != cfg.Batch {
		if err == nil {
			err = fmt.Errorf("/v1/check/batch: status %d, %d results", code, len(out.Results))
		}
		if ctx.Err() == nil {
			tl.fail(err)
		}
		return 0, 0, int64(cfg.Batch)
	}
	for i, res := range out.Results {
		switch {
		case res.Allowed == nil:
			errs++
			tl.fail(fmt.Errorf("/v1/check/batch: item %d was not decided: %s", i, res.Detail))
		case *res.Allowed:
			allowed++
			tl.add(first.org.ID, targets[i].team, targets[i].user, cfg.Cost)
		default:
			denied++
		}
	}
	return allowed, denied, errs
}

// ended reports whether ctx is done or past its deadline: gRPC fails a call at the
// deadline by its own timer, which may fire before the context's.
func ended(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(dl)
}

// sendGRPC makes one ShouldRateLimit call of one [team, user] descriptor, or (GRPCPath) of the three of its path.
func sendGRPC(ctx context.Context, rc rlsv3.RateLimitServiceClient, cfg *Config, t target, tl *tally) (allowed, denied, errs int64) {
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+t.org.Key)
	ds := []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
		{Key: "team", Value: t.team}, {Key: "user", Value: t.user}}}}
	if cfg.GRPCPath {
		org := &ratelimitv3.RateLimitDescriptor_Entry{Key: "org", Value: t.org.ID}
		team := &ratelimitv3.RateLimitDescriptor_Entry{Key: "team", Value: t.team}
		ds = []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{org}},
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{org, team}},
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{org, team, {Key: "user", Value: t.user}}}}
	}
	res, err := rc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "loadgen", HitsAddend: uint32(cfg.Cost), Descriptors: ds})
	switch {
	case err != nil:
		if !ended(ctx) {
			tl.fail(fmt.Errorf("ShouldRateLimit: %w", err))
		}
		return 0, 0, 1
	case res.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		tl.add(t.org.ID, t.team, t.user, cfg.Cost)
		return 1, 0, 0
	}
	return 0, 1, 0
}

// verify compares, for every level, the usage the api reports and the units this
// run saw allowed with the level's month limit. Usage may exceed the run's own
// tally when the orgs were reused (earlier runs) but never the limit.
func verify(ctx context.Context, c *client, cfg *Config, orgs []Org, tl *tally, rep *Report) {
	over := func(format string, a ...any) { rep.OverAdmit = append(rep.OverAdmit, fmt.Sprintf(format, a...)) }
	tallies := map[string]*tally{metricRequests: tl, metricTokens: tl.tokens}
	for _, m := range cfg.metrics() {
		t := tallies[m.metric]
		for _, o := range orgs {
			if n := t.org[o.ID]; n > m.month["org"] {
				over("org %s: %d %s allowed by answers, limit %d", o.ID, n, m.metric, m.month["org"])
			}
		}
		for k, n := range t.team {
			if n > m.month["team"] {
				over("team %s/%s: %d %s allowed by answers, limit %d", k[0], k[1], n, m.metric, m.month["team"])
			}
		}
		for k, n := range t.user {
			if n > m.month["user"] {
				over("user %s/%s/%s: %d %s allowed by answers, limit %d", k[0], k[1], k[2], n, m.metric, m.month["user"])
			}
		}
	}
	checked := 0
	for _, o := range orgs {
		var u api.Usage
		code, err := c.admin(ctx, "GET", "/v1/orgs/"+o.ID+"/usage", o.Key, nil, &u)
		if code == http.StatusNotImplemented {
			rep.VerifyNotes = append(rep.VerifyNotes, "the usage API is not available in this build: verified by the answers only")
			break
		}
		if err != nil {
			rep.VerifyNotes = append(rep.VerifyNotes, fmt.Sprintf("usage of %s: %v", o.ID, err))
			continue
		}
		checked++
		for _, m := range u.Metrics {
			levels := append([]api.UsageLevel{m.Org}, m.Teams...)
			levels = append(levels, m.Users...)
			for _, l := range levels {
				for _, w := range l.Limits {
					if w.Window == vocab.Month && w.Used > w.Limit {
						over("%s %s: usage API says %d %s used of %d", o.ID, l.Id, w.Used, m.Metric, w.Limit)
					}
				}
			}
			if t := tallies[m.Metric]; t != nil && m.Org.Used < t.org[o.ID] {
				over("org %s: usage API says %d %s used, but %d were allowed", o.ID, m.Org.Used, m.Metric, t.org[o.ID])
			}
		}
	}
	rep.Verified = len(rep.OverAdmit) == 0
	if checked > 0 {
		rep.VerifyNotes = append(rep.VerifyNotes, fmt.Sprintf("usage API checked for %d orgs", checked))
	}
}
