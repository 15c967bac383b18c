package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/internal/worker"
	"github.com/quotaplane/quotaplane/webhook"
)

// webhookMaster is the QUOTA_WEBHOOK_SECRET of the billing replicas.
var webhookMaster = []byte("httpapi-test-webhook-master")

// The signing secret the API gives an org verifies what the worker really sends it,
// and every attempt shows in the org's delivery log, newest first, page by page.
func TestWebhookSecretVerifiesADeliveredWebhook(t *testing.T) {
	b := newBillingReplica(t)
	ctx := context.Background()
	org := testenv.ID(t, "hook")

	var mu sync.Mutex
	type delivery struct {
		header string
		body   []byte
	}
	var got []delivery
	fail := true
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, delivery{r.Header.Get(webhooks.SignatureHeader), body})
		if fail {
			http.Error(w, "not yet", http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()

	b.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p-`+org+`","name":"P","fail_mode":"closed",
		"limits":[{"metric":"requests","window":"month","limit":10}]}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p-`+org+`","webhook_url":"`+recv.URL+`/hook?token=abc"}`, 201)
	b.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"other-`+org+`","name":"O2","plan":"p-`+org+`"}`, 201)
	b.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng"}`, 201)
	checkKey, adminKey, billingKey := b.key(org, `["check"]`), b.key(org, `["admin"]`), b.key(org, `["billing"]`)
	otherKey := b.key("other-"+org, `["admin"]`)

	// 9 of 10: the flush records the 80 % threshold event of the org.
	b.mustDo("POST", "/v1/check", checkKey, `{"org":"`+org+`","team":"eng","cost":9}`, 200)
	if _, err := b.flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := webhooks.NewStore(b.f.pool).Events(ctx, org, 10)
	if err != nil || len(evs) != 1 {
		t.Fatalf("events: %+v, %v", evs, err)
	}
	// Deliver it the way the worker's River job does: a failed attempt, then a success.
	hook := &worker.WebhookWorker{Deliverer: &webhooks.Deliverer{Store: webhooks.NewStore(b.f.pool), Tenants: b.svc, Secret: webhookMaster,
		Client: webhooks.NewClient(5*time.Second, true)}}
	for attempt := 1; attempt <= 3; attempt++ {
		mu.Lock()
		fail = attempt < 3
		mu.Unlock()
		err := hook.Work(ctx, &river.Job[worker.WebhookArgs]{JobRow: &rivertype.JobRow{Attempt: attempt},
			Args: worker.WebhookArgs{EventID: evs[0].ID}})
		if (err == nil) != (attempt == 3) {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
	}

	var wh api.Webhook
	rec := b.f.do("GET", "/v1/orgs/"+org+"/webhook", adminKey, "")
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &wh) != nil || wh.SigningSecret == nil {
		t.Fatalf("GET webhook: %d %s", rec.Code, rec.Body)
	}
	if rec.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control %q, want no-store", rec.Header().Get("Cache-Control"))
	}
	if wh.Url == nil || *wh.Url != recv.URL+"/hook?token=abc" || wh.SignatureHeader != webhooks.SignatureHeader ||
		strings.Join(wh.Events, ",") != "usage.threshold,period.closed" || wh.Note != nil {
		t.Errorf("webhook settings: %s", rec.Body)
	}
	var other api.Webhook
	_ = json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/other-"+org+"/webhook", operatorToken, "", 200)), &other)
	if other.SigningSecret == nil || *other.SigningSecret == *wh.SigningSecret || other.Url != nil {
		t.Errorf("another org's settings: %+v", other)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(got) != 3 {
		t.Fatalf("receiver got %d requests, want 3", len(got))
	}
	for i, d := range got {
		if err := webhook.Verify(*wh.SigningSecret, d.header, d.body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("delivery %d does not verify with the secret the API gave: %v", i+1, err)
		}
		if err := webhook.Verify(*other.SigningSecret, d.header, d.body, time.Now(), 5*time.Minute); err == nil {
			t.Errorf("delivery %d verifies with another org's secret", i+1)
		}
		tampered := append([]byte{}, d.body...)
		tampered[len(tampered)-2] ^= 1
		if err := webhook.Verify(*wh.SigningSecret, d.header, tampered, time.Now(), 5*time.Minute); err == nil {
			t.Errorf("a changed body of delivery %d verifies", i+1)
		}
	}

	// The log, newest first, two per page: attempt 3 (204), 2 (502), then 1 (502).
	var p1, p2 api.WebhookDeliveryList
	_ = json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/webhook-deliveries?limit=2", adminKey, "", 200)), &p1)
	if len(p1.Items) != 2 || p1.NextCursor == nil {
		t.Fatalf("first page: %+v", p1)
	}
	_ = json.Unmarshal([]byte(b.mustDo("GET", "/v1/orgs/"+org+"/webhook-deliveries?limit=2&cursor="+*p1.NextCursor, adminKey, "", 200)), &p2)
	if len(p2.Items) != 1 || p2.NextCursor != nil {
		t.Fatalf("second page: %+v", p2)
	}
	items := append(p1.Items, p2.Items...)
	for i, d := range items {
		attempt := 3 - i
		wantStatus, wantOK := 502, false
		if attempt == 3 {
			wantStatus, wantOK = 204, true
		}
		if d.Attempt != attempt || d.Event != webhooks.EventThreshold || d.EventId != evs[0].ID || d.StatusCode == nil ||
			*d.StatusCode != wantStatus || d.Succeeded != wantOK || (d.Error == nil) != wantOK || d.Url != recv.URL+"/hook" {
			t.Errorf("delivery %d: %+v", i, d)
		}
		if i > 0 && d.Id >= items[i-1].Id {
			t.Errorf("deliveries not newest first: %d after %d", d.Id, items[i-1].Id)
		}
	}

	for _, tc := range []struct {
		name, path, token string
		want              int
	}{
		{"settings: billing scope only", "/v1/orgs/" + org + "/webhook", billingKey, 403},
		{"settings: other org's key", "/v1/orgs/" + org + "/webhook", otherKey, 404},
		{"log: billing scope only", "/v1/orgs/" + org + "/webhook-deliveries", billingKey, 403},
		{"log: other org's key", "/v1/orgs/" + org + "/webhook-deliveries", otherKey, 404},
		{"log: other org's log is its own", "/v1/orgs/other-" + org + "/webhook-deliveries", otherKey, 200},
	} {
		if rec := b.f.do("GET", tc.path, tc.token, ""); rec.Code != tc.want {
			t.Errorf("%s: %s = %d, want %d: %s", tc.name, tc.path, rec.Code, tc.want, rec.Body)
		} else if tc.want == 200 && strings.Contains(rec.Body.String(), recv.URL) {
			t.Errorf("%s: shows the first org's deliveries: %s", tc.name, rec.Body)
		}
	}
}

// Without QUOTA_WEBHOOK_SECRET the api has no secret to show: null, with a note.
func TestWebhookWithoutMasterSecret(t *testing.T) {
	pool := testenv.Postgres(t)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Redis: testenv.Redis(t), AdminToken: operatorToken,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Billing: &billing.Service{Store: billing.NewStore(pool), Tenants: svc},
		Webhooks: &webhooks.Service{Store: webhooks.NewStore(pool), Tenants: svc}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, h: h, pool: pool, svc: svc}
	ctx := context.Background()
	if _, err := svc.CreatePlan(ctx, tenants.Actor{Name: "seed"}, tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.CreateOrg(ctx, tenants.Actor{Name: "seed"}, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p"}); err != nil {
		t.Fatal(err)
	}
	rec := f.do("GET", "/v1/orgs/acme/webhook", operatorToken, "")
	var raw map[string]any
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &raw) != nil {
		t.Fatalf("GET webhook: %d %s", rec.Code, rec.Body)
	}
	if v, ok := raw["signing_secret"]; !ok || v != nil {
		t.Errorf("signing_secret = %v (present %v), want null", v, ok)
	}
	if note, _ := raw["note"].(string); !strings.Contains(note, "QUOTA_WEBHOOK_SECRET") {
		t.Errorf("note %q does not name QUOTA_WEBHOOK_SECRET", note)
	}
	if v, ok := raw["url"]; !ok || v != nil {
		t.Errorf("url = %v, want null", v)
	}
}

// The settings say when the URL names an address the worker refuses by default, so
// a URL that works under make run does not fail silently in production.
func TestWebhookURLWarning(t *testing.T) {
	pool := testenv.Postgres(t)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Redis: testenv.Redis(t), AdminToken: operatorToken,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Billing: &billing.Service{Store: billing.NewStore(pool), Tenants: svc},
		Webhooks: &webhooks.Service{Store: webhooks.NewStore(pool), Tenants: svc}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, h: h, pool: pool, svc: svc}
	ctx := context.Background()
	if _, err := svc.CreatePlan(ctx, tenants.Actor{Name: "seed"}, tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, url string
		want      string // in url_warning; "" for none
	}{
		{"loopback", "http://127.0.0.1:9000/hook", "127.0.0.1 is a loopback address"},
		{"localhost", "http://localhost:9000/hook", "localhost names this machine"},
		{"private", "https://10.1.2.3/hook", "10.1.2.3 is a private address"},
		{"link-local", "http://[fe80::1]/hook", "fe80::1 is a link-local address"},
		{"public", "https://hooks.example.com/qp", ""},
		{"public address", "https://203.0.114.7/qp", ""},
		{"none", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			org := testenv.ID(t, "warn")
			if _, err := svc.CreateOrg(ctx, tenants.Actor{Name: "seed"}, tenants.OrgInput{ID: org, Name: "O", PlanID: "p", WebhookURL: tc.url}); err != nil {
				t.Fatal(err)
			}
			rec := f.do("GET", "/v1/orgs/"+org+"/webhook", operatorToken, "")
			var raw map[string]any
			if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &raw) != nil {
				t.Fatalf("GET webhook: %d %s", rec.Code, rec.Body)
			}
			got, present := raw["url_warning"].(string)
			switch {
			case tc.want == "" && present:
				t.Errorf("url_warning %q for %s, want none", got, tc.url)
			case tc.want != "" && (!strings.Contains(got, tc.want) || !strings.Contains(got, "QUOTA_WEBHOOK_ALLOW_PRIVATE=true")):
				t.Errorf("url_warning %q for %s, want one saying %q and naming QUOTA_WEBHOOK_ALLOW_PRIVATE=true", got, tc.url, tc.want)
			}
		})
	}
}

// newWebhookTestFixture is an api whose test webhooks go through the worker's client,
// with its address check on (allowPrivate false) or off; master "" is an api without
// QUOTA_WEBHOOK_SECRET.
func newWebhookTestFixture(t *testing.T, master string, allowPrivate bool) *fixture {
	t.Helper()
	pool := testenv.Postgres(t)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Redis: testenv.Redis(t), AdminToken: operatorToken,
		Logger:   slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Billing:  &billing.Service{Store: billing.NewStore(pool), Tenants: svc},
		Webhooks: &webhooks.Service{Store: webhooks.NewStore(pool), Tenants: svc, Secret: []byte(master), Client: webhooks.NewClient(5*time.Second, allowPrivate)}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, h: h, pool: pool, svc: svc}
	if _, err := svc.CreatePlan(context.Background(), tenants.Actor{Name: "seed"}, tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen}); err != nil {
		t.Fatal(err)
	}
	return f
}

// A test event reaches a real receiver signed with the org's secret, and the answer
// says what the receiver did: its 2xx, its failure, or the refusal of a private
// address with the reason. None of it lands in the delivery log; each is audited.
func TestSendWebhookTest(t *testing.T) {
	var mu sync.Mutex
	type hit struct {
		header, event, delivery string
		body                    []byte
	}
	var hits []hit
	status := http.StatusNoContent
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		hits = append(hits, hit{r.Header.Get(webhooks.SignatureHeader), r.Header.Get(webhooks.EventHeader), r.Header.Get(webhooks.DeliveryHeader), body})
		w.WriteHeader(status)
	}))
	defer recv.Close()
	ctx := context.Background()
	seed := tenants.Actor{Name: "seed"}
	send := func(f *fixture, org string, want int) (api.WebhookTestResult, string) {
		t.Helper()
		rec := f.do("POST", "/v1/orgs/"+org+"/webhook/test", operatorToken, "")
		var res api.WebhookTestResult
		if rec.Code != want {
			t.Fatalf("POST webhook/test of %s = %d, want %d: %s", org, rec.Code, want, rec.Body)
		}
		if want == 200 {
			if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil {
				t.Fatal(err)
			}
		} else if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
			t.Errorf("%d answered as %q, want a problem document", rec.Code, ct)
		}
		return res, rec.Body.String()
	}

	t.Run("delivered and signed", func(t *testing.T) {
		f := newWebhookTestFixture(t, "test-send-master-secret", true)
		if _, err := f.svc.CreateOrg(ctx, seed, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p", WebhookURL: recv.URL + "/hook?token=abc"}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		hits, status = nil, http.StatusNoContent
		mu.Unlock()
		res, _ := send(f, "acme", 200)
		if !res.Succeeded || res.StatusCode == nil || *res.StatusCode != 204 || res.Error != nil || res.Event != "webhook.test" ||
			res.Url != recv.URL+"/hook" || res.UrlWarning != nil {
			t.Errorf("result: %+v", res)
		}
		var wh api.Webhook
		_ = json.Unmarshal(f.do("GET", "/v1/orgs/acme/webhook", operatorToken, "").Body.Bytes(), &wh)
		mu.Lock()
		got := append([]hit{}, hits...)
		mu.Unlock()
		if len(got) != 1 {
			t.Fatalf("receiver got %d requests, want 1", len(got))
		}
		if err := webhook.Verify(*wh.SigningSecret, got[0].header, got[0].body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("the test event does not verify with the org's secret: %v", err)
		}
		var env webhooks.Envelope
		if err := json.Unmarshal(got[0].body, &env); err != nil || env.Type != "webhook.test" || env.Org != "acme" || env.ID != 0 ||
			got[0].event != "webhook.test" || got[0].delivery != "0" {
			t.Errorf("sent %s with event %q delivery %q", got[0].body, got[0].event, got[0].delivery)
		}

		// A failing receiver is the result, not an error of the request.
		mu.Lock()
		status = http.StatusBadGateway
		mu.Unlock()
		res, _ = send(f, "acme", 200)
		if res.Succeeded || res.StatusCode == nil || *res.StatusCode != 502 || res.Error == nil || *res.Error != "receiver answered 502" {
			t.Errorf("failed result: %+v", res)
		}

		var log api.WebhookDeliveryList
		_ = json.Unmarshal(f.do("GET", "/v1/orgs/acme/webhook-deliveries", operatorToken, "").Body.Bytes(), &log)
		if len(log.Items) != 0 {
			t.Errorf("test events in the delivery log: %+v", log.Items)
		}
		var audit api.AuditList
		_ = json.Unmarshal(f.do("GET", "/v1/orgs/acme/audit", operatorToken, "").Body.Bytes(), &audit)
		n := 0
		for _, e := range audit.Items {
			if e.Action == "webhook.test" && e.Actor == "operator" && e.Object == "org:acme" {
				n++
			}
		}
		if n != 2 {
			t.Errorf("%d webhook.test audit entries, want 2: %+v", n, audit.Items)
		}
	})

	t.Run("private address refused with the reason", func(t *testing.T) {
		f := newWebhookTestFixture(t, "test-send-master-secret", false)
		if _, err := f.svc.CreateOrg(ctx, seed, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p", WebhookURL: recv.URL + "/hook"}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		hits, status = nil, http.StatusNoContent
		mu.Unlock()
		res, _ := send(f, "acme", 200)
		if res.Succeeded || res.StatusCode != nil || res.Error == nil || !strings.Contains(*res.Error, "not a public address") {
			t.Errorf("refused result: %+v", res)
		}
		if res.UrlWarning == nil || !strings.Contains(*res.UrlWarning, "127.0.0.1 is a loopback address") ||
			!strings.Contains(*res.UrlWarning, "QUOTA_WEBHOOK_ALLOW_PRIVATE=true") {
			t.Errorf("url_warning does not explain the refusal: %v", res.UrlWarning)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(hits) != 0 {
			t.Errorf("the receiver on a loopback address got %d requests", len(hits))
		}
	})

	t.Run("nothing to send", func(t *testing.T) {
		f := newWebhookTestFixture(t, "test-send-master-secret", true)
		if _, err := f.svc.CreateOrg(ctx, seed, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p"}); err != nil {
			t.Fatal(err)
		}
		if _, body := send(f, "acme", 422); !strings.Contains(body, "no webhook URL") {
			t.Errorf("422 without a URL says %s", body)
		}
		bare := newWebhookTestFixture(t, "", true)
		if _, err := bare.svc.CreateOrg(ctx, seed, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p", WebhookURL: recv.URL}); err != nil {
			t.Fatal(err)
		}
		if _, body := send(bare, "acme", 422); !strings.Contains(body, "QUOTA_WEBHOOK_SECRET") {
			t.Errorf("422 without a signing secret says %s", body)
		}
		var audit api.AuditList
		_ = json.Unmarshal(bare.do("GET", "/v1/orgs/acme/audit", operatorToken, "").Body.Bytes(), &audit)
		for _, e := range audit.Items {
			if e.Action == "webhook.test" {
				t.Errorf("a refused test is audited: %+v", e)
			}
		}
	})
}
