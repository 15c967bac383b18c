package webhooks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/internal/worker"
	"github.com/quotaplane/quotaplane/webhook"
)

var master = []byte("operator-webhook-secret")

// receiver is a webhook endpoint that verifies signatures and can fail on purpose.
type receiver struct {
	t      *testing.T
	org    string
	failN  int // answer 500 to the first failN requests
	mu     sync.Mutex
	hits   int
	got    []webhooks.Envelope
	badSig int
	srv    *httptest.Server
}

func newReceiver(t *testing.T, org string, failN int) *receiver {
	r := &receiver{t: t, org: org, failN: failN}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.hits++
		if err := webhook.Verify(webhooks.SigningSecret(master, org), req.Header.Get(webhooks.SignatureHeader), body,
			time.Now(), 5*time.Minute); err != nil {
			r.badSig++
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		if r.hits <= r.failN {
			http.Error(w, "try again", http.StatusInternalServerError)
			return
		}
		var ev webhooks.Envelope
		if err := json.Unmarshal(body, &ev); err != nil {
			r.t.Errorf("webhook body: %v", err)
		}
		if req.Header.Get(webhooks.EventHeader) != ev.Type {
			r.t.Errorf("event header %q for a %s", req.Header.Get(webhooks.EventHeader), ev.Type)
		}
		r.got = append(r.got, ev)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) received() []webhooks.Envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]webhooks.Envelope(nil), r.got...)
}

// thresholdKeys names each received threshold event by level, id and percentage.
func thresholdKeys(t *testing.T, evs []webhooks.Envelope) []string {
	var out []string
	for _, ev := range evs {
		if ev.Type != webhooks.EventThreshold {
			continue
		}
		var d webhooks.ThresholdData
		if err := json.Unmarshal(ev.Data, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s:%s/%s:%s:%d", d.Level, d.Team, d.User, d.Metric, d.Threshold))
	}
	sort.Strings(out)
	return out
}

// The fourth "Done when": a receiver gets each threshold event once (80 % and 100 %
// of the user's and the team's monthly limits, however many flushes follow) and
// verifies its signature; a failing receiver is retried until it answers, and every
// attempt is in the org's delivery log.
func TestWebhookThresholdsOnceSignedAndRetried(t *testing.T) {
	e := newEnv(t)
	e.migrateRiver()
	ctx := context.Background()
	good, flaky := testenv.ID(t, "good"), testenv.ID(t, "flaky")
	rGood, rFlaky := newReceiver(t, good, 0), newReceiver(t, flaky, 2)
	for org, url := range map[string]string{good: rGood.srv.URL + "/hook", flaky: rFlaky.srv.URL + "/hook"} {
		e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil,
			tenants.TeamInput{ID: "eng", Limits: []vocab.Limit{monthLimit("requests", 20)},
				UserLimits: []vocab.Limit{monthLimit("requests", 10)}})
		if _, err := e.Svc.UpdateOrg(ctx, operator, org, tenants.OrgPatch{WebhookURL: &url}); err != nil {
			t.Fatal(err)
		}
	}
	hook := &worker.WebhookWorker{Deliverer: &webhooks.Deliverer{Store: e.hooks, Tenants: e.Svc, Secret: master,
		Client: webhooks.NewClient(5*time.Second, true)}, Backoff: func(int) time.Duration { return 100 * time.Millisecond }}
	client, _ := e.startWorker("worker-1", nil, hook)
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Queue: func() webhooks.Enqueuer { return worker.DeliveryQueue(client) }, Logger: quietLog()})

	spend := func(org, user string, n int) {
		for range n {
			if _, err := e.Check(e.Engine, org, "eng", user, "requests", 1); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := f.FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, org := range []string{good, flaky} {
		spend(org, "alice", 7) // 70 %: nothing
		spend(org, "alice", 1) // alice 80 %
		spend(org, "alice", 1) // still 80 %: nothing new
		spend(org, "alice", 5) // alice 100 % (the last 4 denied), team 10/20
		spend(org, "bob", 6)   // team 16/20: team 80 %
		spend(org, "bob", 10)  // bob 100 % (and 80 % on the way), team 100 %
		spend(org, "carol", 3) // denied at the team: nothing new
		spend(org, "alice", 0) // idle flushes
	}
	want := []string{"team:eng/:requests:100", "team:eng/:requests:80",
		"user:eng/alice:requests:100", "user:eng/alice:requests:80",
		"user:eng/bob:requests:100", "user:eng/bob:requests:80"}
	waitFor(t, 20*time.Second, "every threshold event delivered", func() bool {
		return len(thresholdKeys(t, rGood.received())) >= len(want) && len(thresholdKeys(t, rFlaky.received())) >= len(want)
	})
	time.Sleep(300 * time.Millisecond) // a duplicate would arrive meanwhile
	for name, r := range map[string]*receiver{"good": rGood, "flaky": rFlaky} {
		if got := thresholdKeys(t, r.received()); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s receiver got %v, want each of %v once", name, got, want)
		}
		if r.badSig != 0 {
			t.Errorf("%s receiver: %d bad signatures", name, r.badSig)
		}
	}
	// The flaky receiver failed twice: those attempts were retried, and logged.
	ds, _, err := e.hooks.Deliveries(ctx, flaky, tenants.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var failed, ok int
	retried := map[int64]int{}
	for _, d := range ds {
		if d.Succeeded {
			ok++
		} else {
			failed++
			if d.StatusCode != 500 {
				t.Errorf("failed delivery %+v", d)
			}
		}
		retried[d.EventID] = max(retried[d.EventID], d.Attempt)
	}
	if failed != 2 || ok != len(want) {
		t.Errorf("flaky delivery log: %d failed, %d succeeded; want 2 and %d", failed, ok, len(want))
	}
	maxAttempt := 0
	for _, a := range retried {
		maxAttempt = max(maxAttempt, a)
	}
	if maxAttempt < 2 {
		t.Errorf("no event was retried: attempts %v", retried)
	}
	t.Logf("good receiver: %d deliveries; flaky receiver: %d attempts logged (%d failed with 500, retried; highest attempt %d)",
		rGood.hits, len(ds), failed, maxAttempt)
	// Every event is in the org's event list too.
	evs, err := e.hooks.Events(ctx, good, 100)
	if err != nil || len(evs) != len(want) {
		t.Fatalf("events of %s: %d (%v), want %d", good, len(evs), err, len(want))
	}
}

// An org that sets its webhook just before a threshold is crossed gets the event: the
// flusher's limits of the org, cached for a few seconds, were read while it had no
// webhook, and the event was recorded but never sent (the README's webhook example
// hit this: it sets the URL, then spends 80 %).
func TestWebhookSetJustBeforeAThresholdIsSent(t *testing.T) {
	e := newEnv(t)
	e.migrateRiver()
	ctx := context.Background()
	org := testenv.ID(t, "late")
	rcv := newReceiver(t, org, 0)
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil,
		tenants.TeamInput{ID: "eng", UserLimits: []vocab.Limit{monthLimit("requests", 10)}})
	hook := &worker.WebhookWorker{Deliverer: &webhooks.Deliverer{Store: e.hooks, Tenants: e.Svc, Secret: master,
		Client: webhooks.NewClient(5*time.Second, true)}, Backoff: func(int) time.Duration { return 100 * time.Millisecond }}
	client, _ := e.startWorker("worker-late", nil, hook)
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Queue: func() webhooks.Enqueuer { return worker.DeliveryQueue(client) }, Logger: quietLog()})
	spend := func(n int64) {
		t.Helper()
		if _, err := e.Check(e.Engine, org, "eng", "alice", "requests", n); err != nil {
			t.Fatal(err)
		}
		if _, err := f.FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	spend(1) // the flusher learns the org's limits, without a webhook
	url := rcv.srv.URL + "/hook"
	if _, err := e.Svc.UpdateOrg(ctx, operator, org, tenants.OrgPatch{WebhookURL: &url}); err != nil {
		t.Fatal(err)
	}
	spend(7) // alice at 80 %
	waitFor(t, 20*time.Second, "the threshold event delivered", func() bool { return len(rcv.received()) > 0 })
	if got := thresholdKeys(t, rcv.received()); strings.Join(got, " ") != "user:eng/alice:requests:80" {
		t.Errorf("received %v, want alice's 80 %% once", got)
	}
}

// A webhook target on a loopback or private address, given as an IP or as a name
// that resolves to one, is refused before anything is sent, and the job is not
// retried; with allowPrivate the same target is reached.
func TestWebhookPrivateTargetRefused(t *testing.T) {
	var hits int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hits++
		mu.Unlock()
	}))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	refusing := webhooks.NewClient(2*time.Second, false)
	for _, target := range []string{srv.URL, "http://localhost:" + port + "/x", "http://[::1]:" + port + "/",
		"http://10.0.0.1:" + port + "/", "http://169.254.169.254/latest/meta-data"} {
		_, err := refusing.Post(target, "application/json", strings.NewReader("{}"))
		if !errors.Is(err, webhooks.ErrPrivateTarget) {
			t.Errorf("%s: %v, want ErrPrivateTarget", target, err)
		}
	}
	mu.Lock()
	if hits != 0 {
		t.Fatalf("a refused target was reached %d times", hits)
	}
	mu.Unlock()
	if resp, err := webhooks.NewClient(2*time.Second, true).Post(srv.URL, "application/json", strings.NewReader("{}")); err != nil {
		t.Fatalf("allowed private target: %v", err)
	} else {
		resp.Body.Close()
	}
	mu.Lock()
	hits = 0
	mu.Unlock()
	// Redirects are not followed (a public target could bounce to a private one).
	redirect := httptest.NewServer(http.RedirectHandler(srv.URL, http.StatusFound))
	defer redirect.Close()
	resp, err := webhooks.NewClient(2*time.Second, true).Post(redirect.URL, "application/json", strings.NewReader("{}"))
	if err != nil || resp.StatusCode != http.StatusFound {
		t.Fatalf("redirect: %v %v", resp, err)
	}
	resp.Body.Close()

	// Through the job: the attempt is logged as refused and the job cancelled.
	e := newEnv(t)
	e.migrateRiver()
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 10)}, nil, tenants.TeamInput{ID: "eng"})
	url := "http://localhost:" + port + "/hook"
	if _, err := e.Svc.UpdateOrg(ctx, operator, org, tenants.OrgPatch{WebhookURL: &url}); err != nil {
		t.Fatal(err)
	}
	client, _ := e.startWorker("worker-1", nil, &worker.WebhookWorker{Deliverer: &webhooks.Deliverer{Store: e.hooks, Tenants: e.Svc, Secret: master,
		Client: refusing}, Backoff: func(int) time.Duration { return 50 * time.Millisecond }})
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Queue: func() webhooks.Enqueuer { return worker.DeliveryQueue(client) }, Logger: quietLog()})
	for range 8 {
		if _, err := e.Check(e.Engine, org, "eng", "", "requests", 1); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the webhook job to be cancelled", func() bool {
		return e.count(`SELECT count(*) FROM river_job WHERE kind = 'billing.webhook' AND state = 'cancelled'`) == 1
	})
	ds, _, err := e.hooks.Deliveries(ctx, org, tenants.Page{Limit: 10})
	if err != nil || len(ds) != 1 || ds[0].Succeeded || !strings.Contains(ds[0].Error, "not a public address") {
		t.Fatalf("delivery log: %+v, %v", ds, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if hits != 0 {
		t.Fatalf("the private target was reached %d times", hits)
	}
}
