package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// The requests of -mode multi and -mode pairs are API.md's, byte for byte: a check
// whose `costs` replaces `metric` and `cost`; a reservation of 1 unit of requests with
// a ttl and on_expiry release; the release, DELETE /v1/reservations/{id}; and plans,
// teams and user defaults carrying the tokens or concurrent limits the mode needs.
func TestModeRequestBodies(t *testing.T) {
	js := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	multi := Config{URL: "u", AdminToken: "a", Mode: ModeMulti, Tokens: 1200, UserMonth: 10, TeamMonth: 20, OrgMonth: 30}
	pairs := Config{URL: "u", AdminToken: "a", Mode: ModePairs, UserMonth: 10, TeamMonth: 20, OrgMonth: 30,
		UserConcurrent: 3, TeamConcurrent: 5, OrgConcurrent: 8}
	check := Config{URL: "u", AdminToken: "a", UserMonth: 10, TeamMonth: 20, OrgMonth: 30}
	for _, c := range []*Config{&multi, &pairs, &check} {
		if err := c.defaults(); err != nil {
			t.Fatal(err)
		}
	}
	tg := target{org: &Org{ID: "acme"}, team: "eng", user: "alice"}
	for _, tc := range []struct{ name, got, want string }{
		{"multi-metric check", js(multi.multiCheck(tg)),
			`{"org":"acme","team":"eng","user":"alice","costs":{"requests":1,"tokens":1200}}`},
		{"acquire", js(acquire(tg)),
			`{"org":"acme","team":"eng","user":"alice","metric":"requests","amount":1,"ttl_seconds":30,"on_expiry":"release"}`},
		{"release", releasePath("r_1"), `/v1/reservations/r_1`},
		{"multi org limits", js(multi.levelLimits("org")),
			`[{"limit":30,"metric":"requests","window":"month"},{"limit":36000,"metric":"tokens","window":"month"}]`},
		{"multi user limits", js(multi.levelLimits("user")),
			`[{"limit":10,"metric":"requests","window":"month"},{"limit":12000,"metric":"tokens","window":"month"}]`},
		{"pairs org limits", js(pairs.levelLimits("org")),
			`[{"limit":30,"metric":"requests","window":"month"},{"limit":8,"metric":"requests","window":"concurrent"}]`},
		{"pairs team limits", js(pairs.levelLimits("team")),
			`[{"limit":20,"metric":"requests","window":"month"},{"limit":5,"metric":"requests","window":"concurrent"}]`},
		{"pairs user limits", js(pairs.levelLimits("user")),
			`[{"limit":10,"metric":"requests","window":"month"},{"limit":3,"metric":"requests","window":"concurrent"}]`},
		{"one-metric plan unchanged", js(check.levelLimits("org")), `[{"limit":30,"metric":"requests","window":"month"}]`},
	} {
		if tc.got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, tc.got, tc.want)
		}
	}
	for _, bad := range []Config{
		{URL: "u", AdminToken: "a", Mode: ModeMulti, Batch: 10},
		{URL: "u", AdminToken: "a", Mode: ModePairs, GRPCAddr: "127.0.0.1:1"},
		{URL: "u", AdminToken: "a", Mode: "concurrency"},
		{URL: "u", AdminToken: "a", Mode: ModePairs, Hold: 30 * time.Second},
	} {
		if err := bad.defaults(); err == nil {
			t.Errorf("mode %q with batch %d, grpc %q accepted", bad.Mode, bad.Batch, bad.GRPCAddr)
		}
	}
}

// recorder is an HTTP server that records what the load tool sends and answers as
// API.md says, so that what the tool does with the answers is tested where the api on
// this branch does not take the mode yet (TestRunModes runs the real api). refuseAt >
// 0 answers that request of the run, and every later one, with a 400.
type recorder struct {
	mu       sync.Mutex
	refuseAt int
	n        int
	acquired map[string]time.Time // id -> when held
	released map[string]int       // id -> DELETEs
	held     time.Duration        // the shortest time a slot was held
	bodies   []string
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	defer rc.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/usage"):
		_, _ = io.WriteString(w, `{"metrics":[{"metric":"requests","org":{"id":"o","reserved":0,"in_flight":0,"limits":[]},"teams":[],"users":[]}]}`)
		return
	case r.URL.Path == "/v1/check" || r.URL.Path == "/v1/reservations" || strings.HasPrefix(r.URL.Path, "/v1/reservations/"):
	default: // provisioning
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"k","secret":"s"}`)
		return
	}
	rc.n++
	if rc.refuseAt > 0 && rc.n >= rc.refuseAt {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"status":400,"detail":"unknown field \"costs\""}`)
		return
	}
	if len(rc.bodies) < 50 {
		rc.bodies = append(rc.bodies, r.Method+" "+r.URL.Path+" "+string(body))
	}
	switch {
	case r.URL.Path == "/v1/check":
		_, _ = io.WriteString(w, `{"allowed":true,"mode":"enforce","levels":[]}`)
	case r.Method == "POST" && r.URL.Path == "/v1/reservations":
		id := fmt.Sprintf("r_%d", rc.n)
		rc.acquired[id] = time.Now()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%q,"state":"held","amount":1,"metric":"requests","org":"o","on_expiry":"release","expires_at":"2030-01-01T00:00:00Z"}`, id)
	case r.Method == "DELETE":
		id := strings.TrimPrefix(r.URL.Path, "/v1/reservations/")
		rc.released[id]++
		if d := time.Since(rc.acquired[id]); rc.held == 0 || d < rc.held {
			rc.held = d
		}
		fmt.Fprintf(w, `{"id":%q,"state":"released","amount":1,"metric":"requests","org":"o","on_expiry":"release","expires_at":"2030-01-01T00:00:00Z"}`, id)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func runRecorded(t *testing.T, rc *recorder, cfg Config) (Report, error) {
	t.Helper()
	rc.acquired, rc.released = map[string]time.Time{}, map[string]int{}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	cfg.URL, cfg.AdminToken, cfg.Orgs, cfg.Teams, cfg.Users = srv.URL, "tok", 2, 2, 3
	orgs, err := Provision(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return Run(context.Background(), cfg, orgs)
}

// Every slot a pair acquires is released exactly once, after being held for -hold,
// those acquired just before the end of the run too (their release goes out after
// it); the report counts the pairs and their rate.
func TestPairsReleaseEverySlotOnce(t *testing.T) {
	rc := &recorder{}
	rep, err := runRecorded(t, rc, Config{Mode: ModePairs, Concurrency: 4, Duration: 300 * time.Millisecond, Hold: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.acquired) == 0 || int64(len(rc.acquired)) != rep.Allowed || rep.Errors != 0 || rep.Requests != rep.Allowed {
		t.Fatalf("%d acquired; report: %d pairs, %d held, %d errors", len(rc.acquired), rep.Requests, rep.Allowed, rep.Errors)
	}
	for id := range rc.acquired {
		if rc.released[id] != 1 {
			t.Errorf("slot %s released %d times", id, rc.released[id])
		}
	}
	if rc.held < 40*time.Millisecond {
		t.Errorf("a slot was held %v, -hold 40ms", rc.held)
	}
	sent := strings.Join(rc.bodies, "\n")
	if !strings.HasPrefix(rc.bodies[0], `POST /v1/reservations {"org":"lg-org-`) || !strings.Contains(rc.bodies[0], `"metric":"requests","amount":1,"ttl_seconds":30,"on_expiry":"release"}`) ||
		!strings.Contains(sent, "DELETE /v1/reservations/r_1 \n") {
		t.Errorf("requests sent:\n%s", sent)
	}
	if !rep.Verified || rep.PairsPS <= 0 || rep.MaxInFlight["user"] < 1 {
		t.Errorf("report: %+v", rep)
	}
}

// A mode the api refuses ends the run at the first refusal, however long -duration,
// and the run reports a RefusedError naming the contract section it needs.
func TestRefusalEndsTheRun(t *testing.T) {
	rc := &recorder{refuseAt: 5}
	start := time.Now()
	rep, err := runRecorded(t, rc, Config{Mode: ModeMulti, Concurrency: 2, Duration: 20 * time.Second})
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Mode != ModeMulti || refused.Status != http.StatusBadRequest ||
		!strings.Contains(err.Error(), `"Several metrics in one decision"`) || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("err = %v; want a RefusedError of mode multi naming its section and the api's answer", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a refused run took %v of its 20s", d)
	}
	if rep.Refused != err.Error() || rep.Verified {
		t.Errorf("report: refused %q, verified %v", rep.Refused, rep.Verified)
	}
	if want := `POST /v1/check {"org":"lg-org-`; !strings.HasPrefix(rc.bodies[0], want) || !strings.Contains(rc.bodies[0], `"costs":{"requests":1,"tokens":1000}}`) {
		t.Errorf("first check sent: %s", rc.bodies[0])
	}
}

// The report of each mode says what it measured in its own unit.
func TestReportTextModes(t *testing.T) {
	lat := map[string]float64{"p50": 1, "p90": 2, "p99": 3, "p99.9": 4, "max": 5}
	for _, tc := range []struct {
		rep  Report
		want []string
	}{
		{Report{Mode: ModeMulti, Metrics: []string{"requests", "tokens"}, Requests: 100, Checks: 100, Allowed: 90, Denied: 10,
			Seconds: 2, RPS: 50, ChecksPS: 50, LatencyMS: lat, Verified: true},
			[]string{"requests   100 in 2.0s: 50 req/s, 50 checks/s of 2 metrics (requests+tokens)\n",
				"checks     90 allowed, 10 denied, 0 errors\n", "verified   no level admitted more than its limit\n"}},
		{Report{Mode: ModePairs, Requests: 300, Checks: 300, Allowed: 280, Denied: 20, Errors: 1, Seconds: 3, RPS: 100, PairsPS: 100,
			LatencyMS: lat, Verified: true, MaxInFlight: map[string]int64{"org": 8, "team": 5, "user": 3}},
			[]string{"pairs      300 acquire+release in 3.0s: 100 pairs/s (2 requests each)\n",
				"acquires   280 held and released, 20 denied, 1 errors\n",
				"in flight  at most 8 at an org, 5 at a team, 3 at a user at once\n",
				"verified   no level held more than its concurrent limit; nothing held after the run\n"}},
		{Report{Mode: ModePairs, Refused: `the api refused a plan with a concurrent limit (400): ...`},
			[]string{"REFUSED    mode pairs: the api refused a plan with a concurrent limit (400): ...; nothing measured\n"}},
		{Report{Mode: ModeCheck, Requests: 10, Checks: 10, Seconds: 1, RPS: 10, ChecksPS: 10, LatencyMS: lat, Verified: true},
			[]string{"requests   10 in 1.0s: 10 req/s, 10 checks/s\n"}},
	} {
		var b bytes.Buffer
		tc.rep.Text(&b)
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("mode %s report lacks %q:\n%s", tc.rep.Mode, w, b.String())
			}
		}
		if tc.rep.Refused != "" && strings.Contains(b.String(), "latency") {
			t.Errorf("a refused run reports figures:\n%s", b.String())
		}
		var page bytes.Buffer
		if err := tc.rep.HTML(&page); err != nil {
			t.Fatal(err)
		}
		if unit := map[bool]string{true: "pairs/s", false: "req/s"}[tc.rep.Mode == ModePairs]; !strings.Contains(page.String(), unit) {
			t.Errorf("mode %s page lacks %q", tc.rep.Mode, unit)
		}
	}
}
