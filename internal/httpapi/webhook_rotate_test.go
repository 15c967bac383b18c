package httpapi_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/webhook"
)

// An org rotates its own signing secret. Until then it signs with the derived secret;
// the rotation answers a new random secret once, the API shows it from then on,
// deliveries verify with it and, for the grace day, with the previous one too (two v1
// signatures), after the day with the new one only. Another org's secret does not
// move; another org's key, a billing key and a check key cannot rotate; the audit row
// carries no secret.
func TestRotateWebhookSecret(t *testing.T) {
	const master = "rotate-test-master-secret"
	ctx := context.Background()
	var mu sync.Mutex
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	var headers []string
	var bodies [][]byte
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		headers, bodies = append(headers, r.Header.Get(webhooks.SignatureHeader)), append(bodies, body)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()

	pool := testenv.Postgres(t)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	store := webhooks.NewStore(pool)
	client := webhooks.NewClient(5*time.Second, true)
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Redis: testenv.Redis(t), AdminToken: operatorToken,
		Logger:   slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Billing:  &billing.Service{Store: billing.NewStore(pool), Tenants: svc},
		Webhooks: &webhooks.Service{Store: store, Tenants: svc, Secret: []byte(master), Client: client, Clock: clock}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, h: h, pool: pool, svc: svc}
	seed := tenants.Actor{Name: "seed"}
	if _, err := svc.CreatePlan(ctx, seed, tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen}); err != nil {
		t.Fatal(err)
	}
	for _, o := range []tenants.OrgInput{{ID: "acme", Name: "Acme", PlanID: "p", WebhookURL: recv.URL + "/hook"}, {ID: "other", Name: "O", PlanID: "p"}} {
		if _, err := svc.CreateOrg(ctx, seed, o); err != nil {
			t.Fatal(err)
		}
	}
	adminKey, billingKey, checkKey := f.mintKey("acme", tenants.ScopeAdmin), f.mintKey("acme", tenants.ScopeBilling), f.mintKey("acme", tenants.ScopeCheck)
	otherKey := f.mintKey("other", tenants.ScopeAdmin)
	deliverer := &webhooks.Deliverer{Store: store, Tenants: svc, Secret: []byte(master), Client: client, Clock: clock}

	secretOf := func(org string) string {
		t.Helper()
		var wh api.Webhook
		rec := f.do("GET", "/v1/orgs/"+org+"/webhook", operatorToken, "")
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &wh) != nil || wh.SigningSecret == nil {
			t.Fatalf("GET webhook of %s: %d %s", org, rec.Code, rec.Body)
		}
		return *wh.SigningSecret
	}
	// deliver records one event of acme, has the worker's Deliverer send it and returns
	// the signature header and body the receiver got.
	n := 0
	deliver := func() (string, []byte) {
		t.Helper()
		n++
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id, err := webhooks.RecordEvent(ctx, tx, nil, "acme", webhooks.EventThreshold, "2026-11", "k"+string(rune('a'+n)), map[string]int{"n": n}, true)
		if err != nil || tx.Commit(ctx) != nil {
			t.Fatalf("record event: %v", err)
		}
		if err := deliverer.Deliver(ctx, id, 1); err != nil {
			t.Fatalf("deliver: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		return headers[len(headers)-1], bodies[len(bodies)-1]
	}
	verifies := func(secret, header string, body []byte) bool {
		return webhook.Verify(secret, header, body, time.Now(), webhook.DefaultTolerance) == nil
	}

	// Before any rotation: the derived secret.
	s0, o0 := secretOf("acme"), secretOf("other")
	if s0 != webhooks.SigningSecret([]byte(master), "acme") || o0 != webhooks.SigningSecret([]byte(master), "other") {
		t.Fatalf("secrets before a rotation are not the derived ones: %s %s", s0, o0)
	}
	if hdr, body := deliver(); !verifies(s0, hdr, body) || strings.Count(hdr, "v1=") != 1 {
		t.Fatalf("delivery before a rotation %q does not verify with the derived secret", hdr)
	}

	// Refused rotations change nothing.
	for _, c := range []struct {
		name, token string
		want        int
	}{{"another org's key", otherKey, 404}, {"billing key", billingKey, 403}, {"check key", checkKey, 403}, {"no key", "", 401}} {
		if rec := f.do("POST", "/v1/orgs/acme/webhook/secret/rotate", c.token, ""); rec.Code != c.want {
			t.Errorf("rotate with %s = %d, want %d: %s", c.name, rec.Code, c.want, rec.Body)
		}
	}
	if got := secretOf("acme"); got != s0 {
		t.Fatalf("a refused rotation changed the secret")
	}

	rotate := func() api.WebhookSecretRotation {
		t.Helper()
		rec := f.do("POST", "/v1/orgs/acme/webhook/secret/rotate", adminKey, "")
		var rot api.WebhookSecretRotation
		if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &rot) != nil {
			t.Fatalf("rotate: %d %s", rec.Code, rec.Body)
		}
		if rec.Header().Get("Cache-Control") != "no-store" {
			t.Errorf("Cache-Control %q, want no-store", rec.Header().Get("Cache-Control"))
		}
		if b, err := hex.DecodeString(rot.SigningSecret); err != nil || len(b) != 32 {
			t.Errorf("new secret %q is not 32 bytes of hex", rot.SigningSecret)
		}
		if !rot.PreviousExpiresAt.Equal(clock().Add(webhooks.SecretGrace)) {
			t.Errorf("previous_expires_at %v, want %v", rot.PreviousExpiresAt, clock().Add(webhooks.SecretGrace))
		}
		return rot
	}
	s1 := rotate().SigningSecret
	if s1 == s0 {
		t.Fatal("the rotation kept the secret")
	}
	if got := secretOf("acme"); got != s1 {
		t.Errorf("GET webhook shows %q after the rotation, want the new secret", got)
	}
	if got := secretOf("other"); got != o0 {
		t.Errorf("another org's secret changed with the rotation: %q, was %q", got, o0)
	}

	// Within the grace: two signatures, either secret verifies, no other does.
	advance(webhooks.SecretGrace - time.Minute)
	hdr, body := deliver()
	if strings.Count(hdr, "v1=") != 2 || !verifies(s1, hdr, body) || !verifies(s0, hdr, body) || verifies(o0, hdr, body) {
		t.Errorf("delivery within the grace %q: new %v, previous %v, other org's %v", hdr, verifies(s1, hdr, body), verifies(s0, hdr, body), verifies(o0, hdr, body))
	}
	// A test event is signed the same way.
	mu.Lock()
	before := len(headers)
	mu.Unlock()
	if rec := f.do("POST", "/v1/orgs/acme/webhook/test", adminKey, ""); rec.Code != 200 {
		t.Fatalf("webhook test: %d %s", rec.Code, rec.Body)
	}
	mu.Lock()
	th, tb := headers[before], bodies[before]
	mu.Unlock()
	if !verifies(s1, th, tb) || !verifies(s0, th, tb) {
		t.Errorf("test event within the grace %q does not verify with both secrets", th)
	}

	// After the grace: the new secret only.
	advance(2 * time.Minute)
	hdr, body = deliver()
	if strings.Count(hdr, "v1=") != 1 || !verifies(s1, hdr, body) || verifies(s0, hdr, body) {
		t.Errorf("delivery after the grace %q: new %v, previous %v", hdr, verifies(s1, hdr, body), verifies(s0, hdr, body))
	}

	// Rotating again: the last secret is the previous one, the first is gone.
	s2 := rotate().SigningSecret
	hdr, body = deliver()
	if s2 == s1 || !verifies(s2, hdr, body) || !verifies(s1, hdr, body) || verifies(s0, hdr, body) {
		t.Errorf("delivery after a second rotation %q: new %v, previous %v, first %v", hdr, verifies(s2, hdr, body), verifies(s1, hdr, body), verifies(s0, hdr, body))
	}

	// The table holds the secrets sealed: a reader of the database cannot sign.
	var stored string
	if err := pool.QueryRow(ctx, `SELECT string_agg(t::text, E'\n') FROM org_webhook_secrets t`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	for i, s := range []string{s0, s1, s2} {
		if strings.Contains(stored, s) {
			t.Errorf("secret %d is stored in clear: %s", i, stored)
		}
	}

	// Two audit rows, neither with a secret.
	rows, err := pool.Query(ctx, `SELECT actor, object, coalesce(before::text, ''), coalesce(after::text, '') FROM audit_log
		WHERE org_id = 'acme' AND action = 'webhook.secret.rotate'`)
	if err != nil {
		t.Fatal(err)
	}
	audited := 0
	for rows.Next() {
		var actor, object, b, a string
		if err := rows.Scan(&actor, &object, &b, &a); err != nil {
			t.Fatal(err)
		}
		audited++
		row := actor + object + b + a
		for _, s := range []string{s0, s1, s2} {
			if strings.Contains(row, s) {
				t.Errorf("audit row carries a secret: %s", row)
			}
		}
		if object != "org:acme" || !strings.Contains(a, "previous_expires_at") {
			t.Errorf("audit row: %s %s %s", actor, object, a)
		}
	}
	if rows.Err() != nil || audited != 2 {
		t.Errorf("audit rows of webhook.secret.rotate: %d (%v), want 2", audited, rows.Err())
	}
}

// Without QUOTA_WEBHOOK_SECRET there is no webhook to sign: a rotation is refused
// with a problem and writes nothing.
func TestRotateWebhookSecretWithoutMaster(t *testing.T) {
	f := newWebhookTestFixture(t, "", true)
	if _, err := f.svc.CreateOrg(context.Background(), tenants.Actor{Name: "seed"}, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p"}); err != nil {
		t.Fatal(err)
	}
	rec := f.do("POST", "/v1/orgs/acme/webhook/secret/rotate", operatorToken, "")
	if rec.Code != 422 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("rotate without a master secret: %d %s", rec.Code, rec.Body)
	}
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM org_webhook_secrets`).Scan(&n); err != nil || n != 0 {
		t.Errorf("org_webhook_secrets rows %d (%v), want 0", n, err)
	}
}
