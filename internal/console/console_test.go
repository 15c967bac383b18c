package console_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/console"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

const (
	adminEmail  = "ada@acme.test"
	viewerEmail = "vic@acme.test"
	password    = "correct horse battery"
)

type env struct {
	h     http.Handler
	pool  *pgxpool.Pool
	svc   *tenants.Service
	clock *testenv.Clock
}

// mustEnv returns the complete api handler with the console on a fresh database
// holding org acme with an admin and a viewer console user, with sign-in limits
// high enough that no test but the limits' own meets them.
func mustEnv(tb testing.TB) env {
	tb.Helper()
	return mustEnvWith(tb, console.Limits{Global: 1000, GlobalWindow: time.Second, PerIP: 1000, IPWindow: time.Second,
		IPFailures: 1000, FreeFailures: 1000}, console.HandlerOptions{})
}

// mustEnvWith is mustEnv with these sign-in limits and handler options.
func mustEnvWith(tb testing.TB, lim console.Limits, hopt console.HandlerOptions) env {
	tb.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(tb)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	a := tenants.Actor{Name: "test"}
	if _, err := svc.CreatePlan(ctx, a, tenants.PlanInput{ID: "pro", Name: "Pro", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{{Metric: "requests", Window: vocab.Month, Limit: 1000}}}); err != nil {
		tb.Fatal(err)
	}
	if _, err := svc.CreateOrg(ctx, a, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "pro"}); err != nil {
		tb.Fatal(err)
	}
	for _, u := range []tenants.ConsoleUserInput{{Email: adminEmail, Password: password, Role: tenants.RoleAdmin},
		{Email: viewerEmail, Password: password, Role: tenants.RoleViewer}} {
		if _, err := svc.CreateConsoleUser(ctx, a, "acme", u); err != nil {
			tb.Fatal(err)
		}
	}
	clk := testenv.NewClock(time.Now())
	sessions := console.NewSessions(pool, svc, console.Options{IdleTimeout: 30 * time.Minute, MaxAge: 12 * time.Hour,
		SignIn: lim, Now: clk.Now})
	assets := fstest.MapFS{"index.html": {Data: []byte("<!doctype html><title>console</title>")},
		"assets/app-1234.js": {Data: []byte("console.log(1)")}}
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, AdminToken: "operator-token-for-tests",
		Console: console.NewHandler(sessions, assets, nil, hopt)})
	if err != nil {
		tb.Fatal(err)
	}
	return env{h: h, pool: pool, svc: svc, clock: clk}
}

type req struct {
	method, path, body string
	cookie, csrf       string
	tls                bool
	contentType        string
	cookieName         string            // the cookie's name; default as the api names it for tls
	from               string            // the client's address; default 192.0.2.1
	header             map[string]string // more request headers
}

func (e env) do(tb testing.TB, r req) *http.Response {
	tb.Helper()
	hr := httptest.NewRequest(r.method, r.path, strings.NewReader(r.body))
	if r.body != "" {
		ct := r.contentType
		if ct == "" {
			ct = "application/json"
		}
		hr.Header.Set("Content-Type", ct)
	}
	if r.cookie != "" {
		name := console.CookieName
		if r.tls {
			name = console.SecureCookieName
		}
		if r.cookieName != "" {
			name = r.cookieName
		}
		hr.AddCookie(&http.Cookie{Name: name, Value: r.cookie})
	}
	if r.from != "" {
		hr.RemoteAddr = r.from + ":40000"
	}
	for k, v := range r.header {
		hr.Header.Set(k, v)
	}
	if r.csrf != "" {
		hr.Header.Set(console.CSRFHeader, r.csrf)
	}
	if r.tls {
		hr.TLS = &tls.ConnectionState{}
	} else {
		hr.TLS = nil
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, hr)
	return w.Result()
}

func body(tb testing.TB, res *http.Response) string {
	tb.Helper()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func sessionCookie(res *http.Response) *http.Cookie {
	for _, c := range res.Cookies() {
		if c.Name == console.CookieName || c.Name == console.SecureCookieName {
			return c
		}
	}
	return nil
}

// mustSignIn signs in and returns the cookie value and the CSRF token.
func (e env) mustSignIn(tb testing.TB, email string) (string, string) {
	tb.Helper()
	res := e.do(tb, req{method: "POST", path: "/console/api/sign-in", body: `{"org":"acme","email":"` + email + `","password":"` + password + `"}`})
	if res.StatusCode != http.StatusOK {
		tb.Fatalf("sign in %s: %d %s", email, res.StatusCode, body(tb, res))
	}
	var s console.Session
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		tb.Fatal(err)
	}
	c := sessionCookie(res)
	if c == nil || s.CSRFToken == "" {
		tb.Fatalf("sign in gave no cookie or CSRF token: %+v", s)
	}
	return c.Value, s.CSRFToken
}

func TestSignInSetsAStrictHttpOnlyCookie(t *testing.T) {
	e := mustEnv(t)
	for _, tc := range []struct {
		name       string
		tls        bool
		wantSecure bool
	}{
		{"plain HTTP", false, false},
		{"TLS", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.do(t, req{method: "POST", path: "/console/api/sign-in", tls: tc.tls,
				body: `{"org":"acme","email":"ADA@acme.test","password":"` + password + `"}`})
			if res.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", res.StatusCode, body(t, res))
			}
			c := sessionCookie(res)
			if c == nil {
				t.Fatal("no session cookie")
			}
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/" || c.Secure != tc.wantSecure {
				t.Errorf("cookie flags: HttpOnly=%v SameSite=%v Path=%q Secure=%v (want Secure=%v)",
					c.HttpOnly, c.SameSite, c.Path, c.Secure, tc.wantSecure)
			}
			if len(c.Value) < 43 { // 32 random bytes, base64url
				t.Errorf("session id %q is shorter than 256 bits", c.Value)
			}
			var s console.Session
			_ = json.NewDecoder(res.Body).Decode(&s)
			if s.OrgID != "acme" || s.Role != tenants.RoleAdmin || s.Email != adminEmail {
				t.Errorf("session = %+v", s)
			}
			if strings.Contains(c.Value, s.CSRFToken) || s.CSRFToken == c.Value {
				t.Error("CSRF token reveals the session id")
			}
		})
	}
}

func TestSessionIsStoredOnlyAsAHash(t *testing.T) {
	e := mustEnv(t)
	id, _ := e.mustSignIn(t, adminEmail)
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM console_sessions WHERE id_hash = sha256($1::bytea)`,
		[]byte(id)).Scan(&n); err != nil || n != 1 {
		t.Fatalf("sessions stored under SHA-256 of the id: %d, %v", n, err)
	}
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM console_sessions WHERE position($1::bytea in id_hash) > 0`,
		[]byte(id)).Scan(&n); err != nil || n != 0 {
		t.Fatalf("raw session id found in the table: %d, %v", n, err)
	}
}

func TestFailedSignInsLookAlike(t *testing.T) {
	e := mustEnv(t)
	unknown := e.do(t, req{method: "POST", path: "/console/api/sign-in", body: `{"org":"acme","email":"nobody@acme.test","password":"whatever123"}`})
	wrong := e.do(t, req{method: "POST", path: "/console/api/sign-in", body: `{"org":"acme","email":"` + adminEmail + `","password":"whatever123"}`})
	ub, wb := body(t, unknown), body(t, wrong)
	if unknown.StatusCode != http.StatusUnauthorized || wrong.StatusCode != http.StatusUnauthorized || ub != wb {
		t.Fatalf("unknown email: %d %s\nwrong password: %d %s", unknown.StatusCode, ub, wrong.StatusCode, wb)
	}
	if sessionCookie(unknown) != nil || sessionCookie(wrong) != nil {
		t.Error("a failed sign-in set a cookie")
	}
}

func TestSignInRefusesFormPosts(t *testing.T) {
	e := mustEnv(t)
	res := e.do(t, req{method: "POST", path: "/console/api/sign-in", contentType: "application/x-www-form-urlencoded",
		body: `{"org":"acme","email":"` + adminEmail + `","password":"` + password + `"}`})
	if res.StatusCode != http.StatusUnsupportedMediaType || sessionCookie(res) != nil {
		t.Fatalf("form-encoded sign-in: %d", res.StatusCode)
	}
}

func TestSessionGivesTheV1APIOfItsOrg(t *testing.T) {
	e := mustEnv(t)
	id, csrf := e.mustSignIn(t, adminEmail)
	tests := []struct {
		name string
		r    req
		want int
	}{
		{"read own org", req{method: "GET", path: "/v1/orgs/acme"}, 200},
		{"another org is 404", req{method: "GET", path: "/v1/orgs/other"}, 404},
		{"operator routes are 403", req{method: "GET", path: "/v1/plans"}, 403},
		{"change without CSRF token", req{method: "POST", path: "/v1/orgs/acme/teams", body: `{"id":"t1","name":"T1"}`}, 403},
		{"change with a wrong CSRF token", req{method: "POST", path: "/v1/orgs/acme/teams", body: `{"id":"t1","name":"T1"}`, csrf: "nope"}, 403},
		{"change with the CSRF token", req{method: "POST", path: "/v1/orgs/acme/teams", body: `{"id":"t1","name":"T1"}`, csrf: csrf}, 201},
		{"check needs a key with scope check", req{method: "POST", path: "/v1/check", body: `{"org":"acme","team":"t1"}`, csrf: csrf}, 403},
		{"plan is the operator's", req{method: "PATCH", path: "/v1/orgs/acme", body: `{"plan":"pro"}`, csrf: csrf}, 403},
		{"mode switch", req{method: "PATCH", path: "/v1/orgs/acme", body: `{"mode":"shadow"}`, csrf: csrf}, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.r.cookie = id
			res := e.do(t, tc.r)
			if res.StatusCode != tc.want {
				t.Fatalf("%s %s: %d %s, want %d", tc.r.method, tc.r.path, res.StatusCode, body(t, res), tc.want)
			}
		})
	}
	// Changes are audited under the console user's name.
	entries, _, err := e.svc.ListAudit(context.Background(), "acme", tenants.Page{})
	if err != nil || len(entries) == 0 || entries[0].Actor != "console:"+adminEmail {
		t.Fatalf("newest audit entry: %+v, %v", entries, err)
	}
}

func TestViewerCannotChangeAnything(t *testing.T) {
	e := mustEnv(t)
	id, csrf := e.mustSignIn(t, viewerEmail)
	for _, tc := range []struct {
		name string
		r    req
		want int
	}{
		{"read teams", req{method: "GET", path: "/v1/orgs/acme/teams"}, 200},
		{"read audit", req{method: "GET", path: "/v1/orgs/acme/audit"}, 200},
		{"create team", req{method: "POST", path: "/v1/orgs/acme/teams", body: `{"id":"t1","name":"T1"}`}, 403},
		{"switch mode", req{method: "PATCH", path: "/v1/orgs/acme", body: `{"mode":"warn"}`}, 403},
		{"create key", req{method: "POST", path: "/v1/orgs/acme/api-keys", body: `{"name":"k","scopes":["check"]}`}, 403},
		{"delete console user", req{method: "DELETE", path: "/v1/orgs/acme/console-users/x"}, 403},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.r.cookie, tc.r.csrf = id, csrf // even with the right CSRF token
			if res := e.do(t, tc.r); res.StatusCode != tc.want {
				t.Fatalf("%d %s, want %d", res.StatusCode, body(t, res), tc.want)
			}
		})
	}
	if teams, _, _ := e.svc.ListTeams(context.Background(), "acme", tenants.Page{}); len(teams) != 0 {
		t.Errorf("a viewer created teams: %+v", teams)
	}
}

func TestSignOutEndsTheSession(t *testing.T) {
	e := mustEnv(t)
	id, csrf := e.mustSignIn(t, adminEmail)
	if res := e.do(t, req{method: "POST", path: "/console/api/sign-out", cookie: id}); res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-out without CSRF token: %d, want 403", res.StatusCode)
	}
	res := e.do(t, req{method: "POST", path: "/console/api/sign-out", cookie: id, csrf: csrf})
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("sign-out: %d %s", res.StatusCode, body(t, res))
	}
	if c := sessionCookie(res); c == nil || c.MaxAge >= 0 {
		t.Errorf("sign-out did not clear the cookie: %+v", c)
	}
	for path, want := range map[string]int{"/console/api/session": 204, "/v1/orgs/acme": 401} {
		if res := e.do(t, req{method: "GET", path: path, cookie: id}); res.StatusCode != want {
			t.Errorf("GET %s after sign-out: %d, want %d", path, res.StatusCode, want)
		}
	}
}

func TestSessionExpiry(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []time.Duration // requests at these gaps
		alive bool
	}{
		{"used within the idle timeout", []time.Duration{20 * time.Minute, 20 * time.Minute, 20 * time.Minute}, true},
		{"idle too long", []time.Duration{31 * time.Minute}, false},
		{"past the absolute expiry although in use", []time.Duration{25 * time.Minute, 25 * time.Minute, 25 * time.Minute,
			25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute,
			25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute,
			25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute,
			25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute, 25 * time.Minute,
			25 * time.Minute, 25 * time.Minute, 25 * time.Minute}, false}, // 12.5 h
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustEnv(t)
			id, _ := e.mustSignIn(t, adminEmail)
			status := 0
			for _, d := range tc.steps {
				e.clock.Add(d)
				status = e.do(t, req{method: "GET", path: "/v1/orgs/acme", cookie: id}).StatusCode
			}
			if got := status == http.StatusOK; got != tc.alive {
				t.Fatalf("last request answered %d, want alive=%v", status, tc.alive)
			}
		})
	}
}

func TestSessionEndpoint(t *testing.T) {
	e := mustEnv(t)
	if res := e.do(t, req{method: "GET", path: "/console/api/session"}); res.StatusCode != http.StatusNoContent {
		t.Fatalf("without a cookie: %d", res.StatusCode)
	}
	id, csrf := e.mustSignIn(t, viewerEmail)
	res := e.do(t, req{method: "GET", path: "/console/api/session", cookie: id})
	var s console.Session
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil || res.StatusCode != 200 {
		t.Fatalf("session: %d %v", res.StatusCode, err)
	}
	if s.Role != tenants.RoleViewer || s.CSRFToken != csrf || s.OrgID != "acme" {
		t.Errorf("session = %+v", s)
	}
	// Deleting the console user ends its sessions.
	users, _, _ := e.svc.ListConsoleUsers(context.Background(), "acme", tenants.Page{})
	for _, u := range users {
		if u.Email == viewerEmail {
			_ = e.svc.DeleteConsoleUser(context.Background(), tenants.Actor{Name: "t"}, "acme", u.ID)
		}
	}
	if res := e.do(t, req{method: "GET", path: "/console/api/session", cookie: id}); res.StatusCode != http.StatusNoContent {
		t.Errorf("session of a deleted user: %d", res.StatusCode)
	}
}

func TestServesTheApp(t *testing.T) {
	e := mustEnv(t)
	for _, tc := range []struct {
		path, wantType string
		want           int
		wantBody       string
	}{
		{"/console/", "text/html; charset=utf-8", 200, "<title>console</title>"},
		{"/console/keys", "text/html; charset=utf-8", 200, "<title>console</title>"}, // the app's own route
		{"/console/assets/app-1234.js", "text/javascript; charset=utf-8", 200, "console.log(1)"},
		{"/console/assets/missing.js", "", 404, ""},
		{"/console", "", 301, ""},
	} {
		t.Run(tc.path, func(t *testing.T) {
			res := e.do(t, req{method: "GET", path: tc.path})
			b := body(t, res)
			if res.StatusCode != tc.want || (tc.wantType != "" && res.Header.Get("Content-Type") != tc.wantType) ||
				!strings.Contains(b, tc.wantBody) {
				t.Fatalf("%d %q %q", res.StatusCode, res.Header.Get("Content-Type"), b)
			}
		})
	}
	if csp := e.do(t, req{method: "GET", path: "/console/"}).Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP = %q", csp)
	}
}

// The console's endpoints answer a wrong method with 405 and Allow, and a malformed
// sign-in with a 400 naming the field, never in Go's words; one problem writer for all.
func TestConsoleRefusalsSpeakTheAPIsTerms(t *testing.T) {
	e := mustEnv(t)
	for _, c := range []struct{ method, path, allow string }{
		{"DELETE", "/console/api/sign-in", "POST"}, {"POST", "/console/api/session", "GET, HEAD"}, {"PUT", "/console/keys", "GET, HEAD"},
	} {
		res := e.do(t, req{method: c.method, path: c.path})
		if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != c.allow ||
			res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s = %d Allow %q, want 405 Allow %q", c.method, c.path, res.StatusCode, res.Header.Get("Allow"), c.allow)
		}
	}
	for _, b := range []string{`{"email":7}`, `{"email":"a@b.c","password":"x","extra":1}`, `[`, `{"email":"a@b.c"}`} {
		res := e.do(t, req{method: "POST", path: "/console/api/sign-in", body: b})
		text := body(t, res)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(text, `"errors":[{"field":`) ||
			strings.Contains(text, "json:") || strings.Contains(text, "Go ") {
			t.Errorf("sign-in %s = %d %s, want a 400 naming the field in the API's terms", b, res.StatusCode, text)
		}
	}
}

// Console emails are unique per org, so an admin of another org creating an account
// with an email that exists elsewhere (any case) gets 201, not a 409 that would tell
// the email exists; each account signs in to its own org, and a wrong org, an unknown
// org and a wrong password are the same 401.
func TestConsoleEmailsDoNotLeakAcrossOrgs(t *testing.T) {
	e := mustEnv(t)
	ctx := context.Background()
	a := tenants.Actor{Name: "test"}
	if _, err := e.svc.CreateOrg(ctx, a, tenants.OrgInput{ID: "beta", Name: "Beta", PlanID: "pro"}); err != nil {
		t.Fatal(err)
	}
	_, token, err := e.svc.CreateAPIKey(ctx, a, "beta", tenants.APIKeyInput{Name: "beta admin", Scopes: []tenants.Scope{tenants.ScopeAdmin}})
	if err != nil {
		t.Fatal(err)
	}
	const betaPassword = "beta's own long password"
	create := func(email string) *http.Response {
		hr := httptest.NewRequest("POST", "/v1/orgs/beta/console-users",
			strings.NewReader(`{"email":"`+email+`","password":"`+betaPassword+`","role":"admin"}`))
		hr.Header.Set("Content-Type", "application/json")
		hr.Header.Set("Authorization", "Bearer "+token)
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, hr)
		return w.Result()
	}
	if res := create(strings.ToUpper(adminEmail)); res.StatusCode != http.StatusCreated {
		t.Fatalf("org beta creating %s: %d %s, want 201", strings.ToUpper(adminEmail), res.StatusCode, body(t, res))
	}
	// Within one org an email is still unique, whatever its case.
	if res := create(adminEmail); res.StatusCode != http.StatusConflict {
		t.Errorf("a second %s in beta: %d, want 409", adminEmail, res.StatusCode)
	}

	signIn := func(org, email, pw string) *http.Response {
		return e.do(t, req{method: "POST", path: "/console/api/sign-in",
			body: `{"org":"` + org + `","email":"` + email + `","password":"` + pw + `"}`})
	}
	for _, c := range []struct{ org, email, pw string }{
		{"acme", adminEmail, password}, {"beta", adminEmail, betaPassword}, {"BETA", strings.ToUpper(adminEmail), betaPassword},
	} {
		res := signIn(c.org, c.email, c.pw)
		if c.org == "BETA" { // org ids are case-sensitive: an unknown org
			if res.StatusCode != http.StatusUnauthorized {
				t.Errorf("sign in to %s: %d, want 401", c.org, res.StatusCode)
			}
			continue
		}
		var s console.Session
		_ = json.NewDecoder(res.Body).Decode(&s)
		if res.StatusCode != http.StatusOK || s.OrgID != c.org {
			t.Errorf("sign in to %s as %s: %d, session %+v", c.org, c.email, res.StatusCode, s)
		}
	}
	var bodies []string
	for _, c := range []struct{ name, org, email, pw string }{
		{"acme's password on beta", "beta", adminEmail, password},
		{"beta's password on acme", "acme", adminEmail, betaPassword},
		{"an org that does not exist", "nope", adminEmail, password},
		{"an email of no org", "acme", "nobody@nowhere.test", password},
	} {
		res := signIn(c.org, c.email, c.pw)
		b := body(t, res)
		if res.StatusCode != http.StatusUnauthorized || sessionCookie(res) != nil {
			t.Errorf("%s: %d %s, want 401", c.name, res.StatusCode, b)
		}
		bodies = append(bodies, b)
	}
	for _, b := range bodies[1:] {
		if b != bodies[0] {
			t.Errorf("failures differ:\n%s\n%s", bodies[0], b)
		}
	}
	// A sign-in without an org is a 400 naming the field.
	res := e.do(t, req{method: "POST", path: "/console/api/sign-in", body: `{"email":"` + adminEmail + `","password":"` + password + `"}`})
	if b := body(t, res); res.StatusCode != http.StatusBadRequest || !strings.Contains(b, `"field":"org"`) {
		t.Errorf("sign-in without org: %d %s", res.StatusCode, b)
	}
	// So is one with the NUL character, which Postgres cannot take (it was a 500,
	// before anyone signed in).
	for field, b := range map[string]string{
		"org":   `{"org":"ac\u0000me","email":"` + adminEmail + `","password":"x"}`,
		"email": `{"org":"acme","email":"a\u0000@b.test","password":"x"}`,
	} {
		res := e.do(t, req{method: "POST", path: "/console/api/sign-in", body: b})
		if got := body(t, res); res.StatusCode != http.StatusBadRequest || !strings.Contains(got, `"field":"`+field+`"`) {
			t.Errorf("sign-in with a NUL in %s: %d %s, want a 400 naming it", field, res.StatusCode, got)
		}
	}
	// A body past the console's cap is a 413 saying so (it was cut and then called
	// "not a JSON object of org, email and password").
	res = e.do(t, req{method: "POST", path: "/console/api/sign-in",
		body: `{"org":"acme","email":"` + adminEmail + `","password":"` + strings.Repeat("x", 100<<10) + `"}`})
	if got := body(t, res); res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(got, "larger than") {
		t.Errorf("a 100 KiB sign-in: %d %s, want 413", res.StatusCode, got)
	}
}

// Credentials in an org's webhook URL (user info, a token in the query) are shown to
// neither a console viewer nor the audit log; an admin sees the URL it set.
func TestWebhookURLCredentialsAreRedacted(t *testing.T) {
	e := mustEnv(t)
	hook := "https://hookuser:hookpass@hooks.example.com/qp?token=hooktoken&x=1"
	if _, err := e.svc.UpdateOrg(context.Background(), tenants.Actor{Name: "test"}, "acme", tenants.OrgPatch{WebhookURL: &hook}); err != nil {
		t.Fatal(err)
	}
	viewer, _ := e.mustSignIn(t, viewerEmail)
	admin, _ := e.mustSignIn(t, adminEmail)
	for _, tc := range []struct {
		who, cookie, path string
		secretsShown      bool
	}{
		{"viewer", viewer, "/v1/orgs/acme", false},
		{"viewer", viewer, "/v1/orgs/acme/audit", false},
		{"admin", admin, "/v1/orgs/acme/audit", false},
		{"admin", admin, "/v1/orgs/acme", true},
	} {
		res := e.do(t, req{method: "GET", path: tc.path, cookie: tc.cookie})
		text := body(t, res)
		if res.StatusCode != 200 || !strings.Contains(text, "hooks.example.com") {
			t.Fatalf("%s GET %s = %d %s", tc.who, tc.path, res.StatusCode, text)
		}
		for _, secret := range []string{"hookpass", "hooktoken"} {
			if strings.Contains(text, secret) != tc.secretsShown {
				t.Errorf("%s GET %s: shows %s = %v, want %v: %s", tc.who, tc.path, secret, !tc.secretsShown, tc.secretsShown, text)
			}
		}
	}
}
