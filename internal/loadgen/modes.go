package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// What one unit of a run's work is (Config.Mode).
const (
	// ModeCheck: a check of one metric, requests (/v1/check, /v1/check/batch or
	// ShouldRateLimit). The default.
	ModeCheck = "check"
	// ModeMulti: a check naming two metrics in `costs`, requests and tokens, decided
	// all-or-nothing (API.md "Several metrics in one decision").
	ModeMulti = "multi"
	// ModePairs: an acquire+release pair, POST /v1/reservations of 1 unit of requests,
	// a metric with a `concurrent` limit at every level, then DELETE
	// /v1/reservations/{id} (API.md "Concurrency limits").
	ModePairs = "pairs"
)

// The metrics of the modes: requests (every mode) and tokens (the second metric of a
// multi-metric check).
const (
	metricRequests = "requests"
	metricTokens   = "tokens"
)

// windowConcurrent is the `concurrent` window of API.md "Concurrency limits": a limit
// on the units held at once by open reservations.
const windowConcurrent vocab.Window = "concurrent"

// pairTTL is each acquired slot's ttl: a slot whose release was lost comes back
// (on_expiry release) within it.
const pairTTL int64 = 30

// RefusedError is a run's mode refused by the api as a request it does not take (400,
// 404, 405 or 422): an api without the contract section the mode needs. Nothing was
// measured.
type RefusedError struct {
	Mode    string // ModeMulti or ModePairs
	What    string // what was refused, e.g. "a check with costs of 2 metrics"
	Section string // the API.md section it needs
	Status  int
	Err     error // the api's answer
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the api refused %s (%s): it does not implement API.md %q", e.What, answer(e.Err), e.Section)
}

// answer shortens an error of client.do, "METHOD /path: 400 {problem document}", to
// "METHOD /path: 400 <the problem's detail>".
func answer(err error) string {
	if err == nil {
		return "no error"
	}
	msg := err.Error()
	i := strings.IndexByte(msg, '{')
	var p struct {
		Detail string `json:"detail"`
	}
	if i < 0 || json.Unmarshal([]byte(msg[i:]), &p) != nil || p.Detail == "" {
		return msg
	}
	return msg[:i] + p.Detail
}

func (e *RefusedError) Unwrap() error { return e.Err }

// refusal reports whether an answer of this status means the api does not take the
// request at all, rather than a decision (429) or a failure (5xx, transport).
func refusal(code int) bool {
	switch code {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

// modeSection is the API.md section a mode needs; "" for ModeCheck.
func modeSection(mode string) string {
	switch mode {
	case ModeMulti:
		return "Several metrics in one decision"
	case ModePairs:
		return "Concurrency limits"
	}
	return ""
}

// metricLimits are one metric's limits per level: month, and for ModePairs concurrent.
type metricLimits struct {
	metric      string
	month, conc map[string]int64 // by level: "org", "team", "user"
}

// metrics are the metrics a run's checks or reservations count, with their limits.
func (c *Config) metrics() []metricLimits {
	req := metricLimits{metric: metricRequests, month: map[string]int64{"org": c.OrgMonth, "team": c.TeamMonth, "user": c.UserMonth}}
	switch c.Mode {
	case ModeMulti:
		// The tokens limits are the requests limits scaled by a check's tokens: both
		// metrics bind at the same count, so either may be the one that stops a check.
		per := max(c.Tokens/c.Cost, 1)
		tokens := metricLimits{metric: metricTokens, month: map[string]int64{}}
		for l, v := range req.month {
			tokens.month[l] = v * per
		}
		return []metricLimits{req, tokens}
	case ModePairs:
		req.conc = map[string]int64{"org": c.OrgConcurrent, "team": c.TeamConcurrent, "user": c.UserConcurrent}
	}
	return []metricLimits{req}
}

// levelLimits are the limits provisioning sets at one level ("org", "team" or "user")
// for the run's mode: each metric's month limit, then its concurrent limit if any.
func (c *Config) levelLimits(level string) api.Limits {
	var out api.Limits
	for _, m := range c.metrics() {
		out = append(out, api.Limit{Metric: m.metric, Window: vocab.Month, Limit: m.month[level]})
		if conc, ok := m.conc[level]; ok {
			out = append(out, api.Limit{Metric: m.metric, Window: windowConcurrent, Limit: conc})
		}
	}
	return out
}

// multiCheck is a check of several metrics (API.md "Several metrics in one
// decision"): `costs` replaces `metric` and `cost`.
type multiCheck struct {
	Org   string           `json:"org"`
	Team  string           `json:"team,omitempty"`
	User  string           `json:"user,omitempty"`
	Costs map[string]int64 `json:"costs"`
}

func (c *Config) multiCheck(t target) multiCheck {
	return multiCheck{Org: t.org.ID, Team: t.team, User: t.user, Costs: map[string]int64{metricRequests: c.Cost, metricTokens: c.Tokens}}
}

// reservationRequest is POST /v1/reservations of one metric (API.md "Reservations").
// The tool keeps its own types for the requests of its modes and the few answer
// fields it reads, so that they stay API.md's whatever the generated types become.
type reservationRequest struct {
	Org        string `json:"org"`
	Team       string `json:"team,omitempty"`
	User       string `json:"user,omitempty"`
	Metric     string `json:"metric"`
	Amount     int64  `json:"amount"`
	TTLSeconds int64  `json:"ttl_seconds"`
	OnExpiry   string `json:"on_expiry"`
}

// reservation is what the tool reads of a reservation's answers.
type reservation struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

// decision is what the tool reads of a check's answer.
type decision struct {
	Allowed bool `json:"allowed"`
}

// acquire is the reservation of one slot: 1 unit of requests, given back whole at
// release (or, if the release is lost, at expiry).
func acquire(t target) reservationRequest {
	return reservationRequest{Org: t.org.ID, Team: t.team, User: t.user, Metric: metricRequests, Amount: 1,
		TTLSeconds: pairTTL, OnExpiry: "release"}
}

// releasePath is where a slot is given back: DELETE /v1/reservations/{id} (API.md
// "Reservations").
func releasePath(id string) string { return "/v1/reservations/" + id }

// sendMulti makes one multi-metric check and counts its answer in both metrics.
func sendMulti(ctx context.Context, c *client, cfg *Config, t target, tl *tally, refused func(error)) (allowed, denied, errs int64) {
	var res decision
	code, err := c.do(ctx, "POST", "/v1/check", t.org.Key, cfg.multiCheck(t), &res)
	switch {
	case code == http.StatusOK && err == nil && res.Allowed:
		tl.add(t.org.ID, t.team, t.user, cfg.Cost)
		tl.tokens.add(t.org.ID, t.team, t.user, cfg.Tokens)
		return 1, 0, 0
	case code == http.StatusOK && err == nil, code == http.StatusTooManyRequests:
		return 0, 1, 0
	case refusal(code):
		refused(&RefusedError{Mode: ModeMulti, What: "a check with costs of 2 metrics", Section: modeSection(ModeMulti), Status: code, Err: err})
		return 0, 0, 1
	}
	if err == nil {
		err = fmt.Errorf("/v1/check: status %d", code)
	}
	if ctx.Err() == nil {
		tl.fail(err)
	}
	return 0, 0, 1
}

// sendPair acquires one slot and, when held, releases it after hold. Both requests go out
// under ctx, the run's parent: a pair begun before the end of the run is finished
// after it, so that no slot stays held past the run (its latency is the pair's).
func sendPair(ctx context.Context, c *client, t target, hold time.Duration, tl *tally, refused func(error)) (allowed, denied, errs int64) {
	var r reservation
	code, err := c.do(ctx, "POST", "/v1/reservations", t.org.Key, acquire(t), &r)
	switch {
	case code == http.StatusCreated && err == nil && r.ID != "":
	case code == http.StatusTooManyRequests:
		return 0, 1, 0
	case refusal(code):
		refused(&RefusedError{Mode: ModePairs, What: "a reservation against a concurrent limit", Section: modeSection(ModePairs), Status: code, Err: err})
		return 0, 0, 1
	default:
		if err == nil {
			err = fmt.Errorf("POST /v1/reservations: status %d, id %q", code, r.ID)
		}
		tl.fail(err)
		return 0, 0, 1
	}
	tl.hold(t, 1)
	if hold > 0 { // the work the slot guards
		select {
		case <-time.After(hold):
		case <-ctx.Done():
		}
	}
	tl.hold(t, -1) // before the release is sent: the api holds the slot at least as long
	var rel reservation
	code, err = c.do(ctx, "DELETE", releasePath(r.ID), t.org.Key, nil, &rel)
	if code != http.StatusOK || err != nil || rel.State != "released" {
		if err == nil {
			err = fmt.Errorf("DELETE %s: status %d, state %q", releasePath(r.ID), code, rel.State)
		}
		tl.fail(err)
		return 0, 0, 1 // held, but not given back as asked: it comes back at its expiry
	}
	return 1, 0, 0
}

// inFlight is the slots this tool held at once per level, as it saw them: from the
// acquire's answer to the release's request, inside the span in which the api holds
// them, so more here than a level's concurrent limit is more held there too.
type inFlight struct {
	mu                       sync.Mutex
	now                      map[string]int64 // by level and ids
	maxOrg, maxTeam, maxUser int64            // the most at once at any org, team, user
}

// hold adds d held slots at t's three levels and keeps each level kind's maximum.
func (tl *tally) hold(t target, d int64) {
	f := &tl.inflight
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.now == nil {
		f.now = map[string]int64{}
	}
	o, tm, u := "o|"+t.org.ID, "t|"+t.org.ID+"/"+t.team, "u|"+t.org.ID+"/"+t.team+"/"+t.user
	f.now[o] += d
	f.now[tm] += d
	f.now[u] += d
	f.maxOrg = max(f.maxOrg, f.now[o])
	f.maxTeam = max(f.maxTeam, f.now[tm])
	f.maxUser = max(f.maxUser, f.now[u])
}

// verifyPairs checks that the slots held at once never passed a concurrent limit, as
// the tool saw them, and that after the run nothing is held: every level's reserved
// units, and in_flight where the usage API reports it, are 0.
func verifyPairs(ctx context.Context, c *client, cfg *Config, orgs []Org, tl *tally, rep *Report) {
	f := &tl.inflight
	rep.MaxInFlight = map[string]int64{"org": f.maxOrg, "team": f.maxTeam, "user": f.maxUser}
	for _, l := range []struct {
		level     string
		held, lim int64
	}{{"org", f.maxOrg, cfg.OrgConcurrent}, {"team", f.maxTeam, cfg.TeamConcurrent}, {"user", f.maxUser, cfg.UserConcurrent}} {
		if l.held > l.lim {
			rep.OverAdmit = append(rep.OverAdmit, fmt.Sprintf("%s: %d slots held at once by the answers, concurrent limit %d", l.level, l.held, l.lim))
		}
	}
	checked := 0
	for _, o := range orgs {
		var u usageDoc
		code, err := c.admin(ctx, "GET", "/v1/orgs/"+o.ID+"/usage", o.Key, nil, &u)
		if code == http.StatusNotImplemented {
			rep.VerifyNotes = append(rep.VerifyNotes, "the usage API is not available in this build: in-flight verified by the answers only")
			break
		}
		if err != nil {
			rep.VerifyNotes = append(rep.VerifyNotes, fmt.Sprintf("usage of %s: %v", o.ID, err))
			continue
		}
		checked++
		for _, m := range u.Metrics {
			for _, l := range append(append([]usageLevel{m.Org}, m.Teams...), m.Users...) {
				held := l.Reserved
				if l.InFlight != nil {
					held = max(held, *l.InFlight)
				}
				for _, w := range l.Limits {
					if w.InFlight != nil {
						held = max(held, *w.InFlight)
					}
				}
				if held != 0 {
					rep.OverAdmit = append(rep.OverAdmit, fmt.Sprintf("%s %s %s: %d units still held after every slot was released", o.ID, l.ID, m.Metric, held))
				}
			}
		}
	}
	if checked > 0 {
		rep.VerifyNotes = append(rep.VerifyNotes, fmt.Sprintf("usage API: nothing held after the run at any level of %d orgs", checked))
	}
}

// usageDoc is the part of GET /v1/orgs/{org}/usage that verifyPairs reads, with
// in_flight (API.md "Concurrency limits") wherever the api reports it: on a level or
// on its concurrent window.
type usageDoc struct {
	Metrics []struct {
		Metric string       `json:"metric"`
		Org    usageLevel   `json:"org"`
		Teams  []usageLevel `json:"teams"`
		Users  []usageLevel `json:"users"`
	} `json:"metrics"`
}

type usageLevel struct {
	ID       string `json:"id"`
	Reserved int64  `json:"reserved"`
	InFlight *int64 `json:"in_flight"`
	Limits   []struct {
		Window   string `json:"window"`
		InFlight *int64 `json:"in_flight"`
	} `json:"limits"`
}

// modeRun picks what one request of the run is; refused, the first time it is called,
// cancels the run.
func modeSend(cfg *Config, c *client, parent context.Context, orgs []Org, tl *tally, refused func(error)) func(ctx context.Context, r *rand.Rand) (int64, int64, int64) {
	switch cfg.Mode {
	case ModeMulti:
		return func(ctx context.Context, r *rand.Rand) (int64, int64, int64) {
			return sendMulti(ctx, c, cfg, pick(cfg, orgs, r), tl, refused)
		}
	case ModePairs:
		return func(_ context.Context, r *rand.Rand) (int64, int64, int64) {
			ctx, cancel := context.WithTimeout(parent, 30*time.Second+cfg.Hold)
			defer cancel()
			return sendPair(ctx, c, pick(cfg, orgs, r), cfg.Hold, tl, refused)
		}
	}
	return func(ctx context.Context, r *rand.Rand) (int64, int64, int64) { return send(ctx, c, cfg, orgs, r, tl) }
}

// errMode is a Config whose mode does not go with its other settings.
var errMode = errors.New("loadgen: -mode multi and -mode pairs send single HTTP requests: not with -batch or -grpc")
