package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	qp "github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// ModeZipf: checks of one metric whose paths follow a Zipf law over every (org,
// team, user) provisioned, many cold and a few hot, sent in three phases of the same
// run, each Config.Duration long at Config.Concurrency workers: by the tool's own
// HTTP client (the server's plain /v1/check figure), by the Go client
// (github.com/quotaplane/quotaplane/client) as it comes, and by the Go client with
// client leases and batching (WithLeases, WithBatching). RunZipf runs it.
const ModeZipf = "zipf"

// Zipf defaults: the law's exponent and the batching wait of the leasing client.
const (
	DefaultZipfS     = 1.1
	DefaultZipfBatch = 2 * time.Millisecond
)

// ZipfPhase is what one phase of a Zipf run measured.
type ZipfPhase struct {
	Name     string  `json:"name"`
	Checks   int64   `json:"checks"`
	Allowed  int64   `json:"allowed"`
	Denied   int64   `json:"denied"`
	Errors   int64   `json:"errors"`
	Leased   int64   `json:"leased"`   // decided in the client's process
	Requests int64   `json:"requests"` // HTTP requests the phase sent
	Seconds  float64 `json:"seconds"`
	ChecksPS float64 `json:"checks_per_second"`
	// VsHTTP is ChecksPS over the plain HTTP phase's, measured in the same run.
	VsHTTP float64 `json:"vs_http"`
}

// ZipfReport is a Zipf run: its phases, and the verification of all of them.
type ZipfReport struct {
	S           float64     `json:"s"`
	Paths       int         `json:"paths"`
	Workers     int         `json:"workers"`
	BatchWaitMS float64     `json:"batch_wait_ms"`
	Phases      []ZipfPhase `json:"phases"`
	OverAdmit   []string    `json:"over_admission"`
	Verified    bool        `json:"verified"`
	VerifyNotes []string    `json:"verify_notes,omitempty"`
	ErrorSample []string    `json:"error_sample,omitempty"`
}

// requestCounter counts the requests of an http.Client.
type requestCounter struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *requestCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// zipfPicker draws paths: rank r (0 the hottest) is org r % orgs, then team, then user.
type zipfPicker struct {
	z    *rand.Zipf
	cfg  *Config
	orgs []Org
}

func (p *zipfPicker) pick() (o *Org, team, user string) {
	r := int(p.z.Uint64())
	o = &p.orgs[r%len(p.orgs)]
	team, user = o.rank(r / len(p.orgs))
	return o, team, user
}

// rank is the team and user of o's path of rank r (0 the hottest) in the Zipf modes'
// order: team r % teams, then user.
func (o *Org) rank(r int) (team, user string) {
	return o.Teams[r%len(o.Teams)], fmt.Sprintf("u%d", r/len(o.Teams))
}

// RunZipf runs the Zipf mode's three phases over orgs and verifies, after the
// leasing clients are closed (their leases settled), that no level admitted more
// than its limit and that the api counted what the answers allowed.
func RunZipf(ctx context.Context, cfg Config, orgs []Org, s float64, batchWait time.Duration) (ZipfReport, error) {
	if err := cfg.defaults(); err != nil {
		return ZipfReport{}, err
	}
	if len(orgs) == 0 {
		return ZipfReport{}, errors.New("loadgen: no orgs to load")
	}
	if s <= 1 {
		s = DefaultZipfS
	}
	if batchWait <= 0 {
		batchWait = DefaultZipfBatch
	}
	paths := len(orgs) * cfg.Teams * cfg.Users
	rep := ZipfReport{S: s, Paths: paths, Workers: cfg.Concurrency, BatchWaitMS: float64(batchWait) / float64(time.Millisecond)}
	tl := newTally()
	hc := newClient(cfg.URL, cfg.Concurrency)

	// The server's figure: the tool's own HTTP client, one /v1/check a request.
	httpPhase := func(ctx context.Context, pk *zipfPicker) (allowed, denied, errs, leased int64) {
		o, team, user := pk.pick()
		var res api.CheckResult
		code, err := hc.do(ctx, "POST", "/v1/check", o.Key, api.CheckRequest{Org: o.ID, Team: &team, User: &user, Cost: &cfg.Cost}, &res)
		switch {
		case code == http.StatusOK && res.Allowed:
			tl.add(o.ID, team, user, cfg.Cost)
			return 1, 0, 0, 0
		case code == http.StatusTooManyRequests:
			return 0, 1, 0, 0
		}
		if err == nil {
			err = fmt.Errorf("/v1/check: status %d", code)
		}
		if ctx.Err() == nil {
			tl.fail(err)
		}
		return 0, 0, 1, 0
	}
	// The Go client's phases: a client per org (a client has one key), sharing one
	// transport whose requests are counted.
	clientPhase := func(opts ...qp.Option) (func(ctx context.Context, pk *zipfPicker) (int64, int64, int64, int64), func(), *requestCounter, error) {
		rc := &requestCounter{next: &http.Transport{MaxIdleConns: cfg.Concurrency * 2, MaxIdleConnsPerHost: cfg.Concurrency * 2,
			MaxConnsPerHost: cfg.Concurrency}}
		clients := map[string]*qp.Client{}
		for _, o := range orgs {
			c, err := qp.New(cfg.URL, o.Key, append([]qp.Option{qp.WithHTTPClient(&http.Client{Transport: rc}),
				qp.WithTimeout(30 * time.Second), qp.WithBudget(30 * time.Second)}, opts...)...)
			if err != nil {
				return nil, nil, nil, err
			}
			clients[o.ID] = c
		}
		closeAll := func() {
			for _, c := range clients {
				if err := c.Close(); err != nil {
					tl.fail(err)
				}
			}
		}
		return func(ctx context.Context, pk *zipfPicker) (allowed, denied, errs, leased int64) {
			o, team, user := pk.pick()
			res, err := clients[o.ID].Check(ctx, qp.CheckRequest{Org: o.ID, Team: team, User: user, Cost: cfg.Cost})
			switch {
			case err != nil:
				if ctx.Err() == nil {
					tl.fail(err)
				}
				return 0, 0, 1, 0
			case res.Allowed:
				tl.add(o.ID, team, user, cfg.Cost)
				if res.Leased {
					return 1, 0, 0, 1
				}
				return 1, 0, 0, 0
			}
			return 0, 1, 0, 0
		}, closeAll, rc, nil
	}

	plainSend, plainClose, plainRC, err := clientPhase()
	if err != nil {
		return rep, err
	}
	leaseSend, leaseClose, leaseRC, err := clientPhase(qp.WithLeases(), qp.WithBatching(batchWait))
	if err != nil {
		return rep, err
	}
	phases := []struct {
		name  string
		send  func(context.Context, *zipfPicker) (int64, int64, int64, int64)
		reqs  func() int64 // nil: one request a check
		close func()
	}{
		{"server, plain HTTP /v1/check", httpPhase, nil, func() {}},
		{"Go client", plainSend, plainRC.n.Load, plainClose},
		{"Go client, leases + batching", leaseSend, leaseRC.n.Load, leaseClose},
	}
	for _, ph := range phases {
		var r0 int64
		if ph.reqs != nil {
			r0 = ph.reqs()
		}
		p := runZipfPhase(ctx, &cfg, orgs, s, paths, ph.send)
		ph.close()
		p.Name, p.Requests = ph.name, p.Checks
		if ph.reqs != nil {
			p.Requests = ph.reqs() - r0
		}
		if len(rep.Phases) > 0 && rep.Phases[0].ChecksPS > 0 {
			p.VsHTTP = p.ChecksPS / rep.Phases[0].ChecksPS
		} else {
			p.VsHTTP = 1
		}
		rep.Phases = append(rep.Phases, p)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "%-30s %9.0f checks/s (%d requests)\n", p.Name, p.ChecksPS, p.Requests)
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	var r Report
	verify(ctx, hc, &cfg, orgs, tl, &r)
	rep.OverAdmit, rep.Verified, rep.VerifyNotes, rep.ErrorSample = r.OverAdmit, r.Verified, r.VerifyNotes, tl.errs
	return rep, nil
}

// runZipfPhase has cfg.Concurrency workers call send for cfg.Duration.
func runZipfPhase(ctx context.Context, cfg *Config, orgs []Org, s float64, paths int,
	send func(context.Context, *zipfPicker) (int64, int64, int64, int64)) ZipfPhase {
	runCtx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	var allowed, denied, errs, leased atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			pk := &zipfPicker{z: rand.NewZipf(r, s, 1, uint64(paths-1)), cfg: cfg, orgs: orgs}
			var a, d, e, l int64
			for runCtx.Err() == nil {
				da, dd, de, dl := send(runCtx, pk)
				if de > 0 && runCtx.Err() != nil {
					break // cut off by the end of the phase
				}
				a, d, e, l = a+da, d+dd, e+de, l+dl
			}
			allowed.Add(a)
			denied.Add(d)
			errs.Add(e)
			leased.Add(l)
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	p := ZipfPhase{Allowed: allowed.Load(), Denied: denied.Load(), Errors: errs.Load(), Leased: leased.Load(), Seconds: el}
	p.Checks = p.Allowed + p.Denied + p.Errors
	p.ChecksPS = float64(p.Checks) / el
	return p
}

// Text writes the report for a person.
func (r ZipfReport) Text(w io.Writer) {
	fmt.Fprintf(w, "zipf       s=%.2f over %d paths, %d workers, batching wait %.1f ms\n", r.S, r.Paths, r.Workers, r.BatchWaitMS)
	for _, p := range r.Phases {
		fmt.Fprintf(w, "  %-30s %9.0f checks/s = %6.2fx the plain HTTP figure; %d allowed, %d denied, %d errors; %.1f%% leased; %.1f checks a request\n",
			p.Name, p.ChecksPS, p.VsHTTP, p.Allowed, p.Denied, p.Errors, 100*float64(p.Leased)/float64(max(p.Checks, 1)),
			float64(p.Checks)/float64(max(p.Requests, 1)))
	}
	for _, e := range r.ErrorSample {
		fmt.Fprintln(w, "error      "+e)
	}
	writeVerified(w, r.Verified, "no level admitted more than its limit; the api counted at least what the answers allowed",
		r.OverAdmit, r.VerifyNotes)
}
