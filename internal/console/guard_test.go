package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/console"
	"github.com/quotaplane/quotaplane/internal/platform/forwarded"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

func signIn(email, pw, from string) req {
	return req{method: "POST", path: "/console/api/sign-in", from: from,
		body: `{"org":"acme","email":"` + email + `","password":"` + pw + `"}`}
}

// retryAfter is a 429's Retry-After in seconds; it fails the test on any other answer.
func retryAfter(tb testing.TB, res *http.Response) int {
	tb.Helper()
	b := body(tb, res)
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Content-Type") != "application/problem+json" {
		tb.Fatalf("want a 429 problem, got %d %s", res.StatusCode, b)
	}
	n, err := strconv.Atoi(res.Header.Get("Retry-After"))
	if err != nil || n < 1 {
		tb.Fatalf("Retry-After = %q", res.Header.Get("Retry-After"))
	}
	return n
}

// A stranger's failures slow the stranger's address, not the account: the owner signs
// in from another address at once, however often the stranger fails, so no stranger
// can lock the owner out.
func TestStrangerCannotLockTheOwnerOut(t *testing.T) {
	e := mustEnvWith(t, console.Limits{FreeFailures: 3, Delay: time.Second, MaxDelay: time.Minute,
		IPFailures: 100, PerIP: 100, IPWindow: time.Second}, console.HandlerOptions{})
	const stranger, owner = "198.51.100.7", "203.0.113.9"
	for round := range 10 {
		for i := 0; i < 3; i++ {
			res := e.do(t, signIn(adminEmail, "wrong password!", stranger))
			if res.StatusCode == http.StatusTooManyRequests {
				e.clock.Add(time.Duration(retryAfter(t, res)) * time.Second)
				res = e.do(t, signIn(adminEmail, "wrong password!", stranger))
			}
			if res.StatusCode != http.StatusUnauthorized {
				t.Fatalf("round %d, failure %d: %d %s", round, i, res.StatusCode, body(t, res))
			}
		}
		if res := e.do(t, signIn(adminEmail, password, owner)); res.StatusCode != http.StatusOK {
			t.Fatalf("round %d: the owner, from another address, got %d %s", round, res.StatusCode, body(t, res))
		}
	}
}

// The delay of one address and email grows with each failure past the free ones
// (1 s, 2 s, 4 s ... up to MaxDelay), is refused before any password is checked, even
// the right one, and a success clears it.
func TestDelayGrowsPerAddressAndEmail(t *testing.T) {
	e := mustEnvWith(t, console.Limits{FreeFailures: 3, Delay: time.Second, MaxDelay: 4 * time.Second,
		IPFailures: 100, PerIP: 100, IPWindow: time.Second}, console.HandlerOptions{})
	const from = "198.51.100.7"
	for i := range 3 {
		if res := e.do(t, signIn(adminEmail, "wrong password!", from)); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("free failure %d: %d", i+1, res.StatusCode)
		}
	}
	for _, want := range []int{1, 2, 4, 4} {
		if got := retryAfter(t, e.do(t, signIn(adminEmail, password, from))); got != want {
			t.Fatalf("Retry-After = %d, want %d", got, want)
		}
		e.clock.Add(time.Duration(want) * time.Second)
		if res := e.do(t, signIn(adminEmail, "wrong password!", from)); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("after the delay: %d", res.StatusCode)
		}
	}
	// Another email from the same address is not held up.
	if res := e.do(t, signIn(viewerEmail, password, from)); res.StatusCode != http.StatusOK {
		t.Fatalf("another email from the address: %d %s", res.StatusCode, body(t, res))
	}
	e.clock.Add(4 * time.Second)
	if res := e.do(t, signIn(adminEmail, password, from)); res.StatusCode != http.StatusOK {
		t.Fatalf("right password after the delay: %d %s", res.StatusCode, body(t, res))
	}
	// The success cleared it: three more free failures.
	for i := range 3 {
		if res := e.do(t, signIn(adminEmail, "wrong password!", from)); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("free failure %d after a success: %d", i+1, res.StatusCode)
		}
	}
}

// Spraying: one address failing once on each of many accounts is throttled after
// IPFailures failures, across accounts, and then gets one attempt per FailureRefill;
// other addresses are not.
func TestSprayingIsThrottledPerAddress(t *testing.T) {
	e := mustEnvWith(t, console.Limits{IPFailures: 5, FailureRefill: time.Minute, FreeFailures: 3,
		PerIP: 100, IPWindow: time.Second}, console.HandlerOptions{})
	const sprayer = "198.51.100.7"
	for i := range 5 {
		if res := e.do(t, signIn(fmt.Sprintf("user%d@acme.test", i), "Winter2026!!", sprayer)); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("spray %d: %d", i+1, res.StatusCode)
		}
	}
	if got := retryAfter(t, e.do(t, signIn(adminEmail, "Winter2026!!", sprayer))); got < 59 || got > 60 {
		t.Errorf("Retry-After = %d, want 60 (one failure per minute)", got)
	}
	if res := e.do(t, signIn(adminEmail, password, "203.0.113.9")); res.StatusCode != http.StatusOK {
		t.Fatalf("another address: %d %s", res.StatusCode, body(t, res))
	}
	e.clock.Add(time.Minute)
	if res := e.do(t, signIn("user9@acme.test", "Winter2026!!", sprayer)); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("after a minute: %d", res.StatusCode)
	}
	retryAfter(t, e.do(t, signIn("user10@acme.test", "Winter2026!!", sprayer)))
}

// Sign-ins from one address are limited whether they succeed or not, and all
// addresses together by the global limit.
func TestSignInRateLimits(t *testing.T) {
	e := mustEnvWith(t, console.Limits{PerIP: 3, IPWindow: time.Minute, Global: 5, GlobalWindow: time.Second}, console.HandlerOptions{})
	for i := range 3 {
		if res := e.do(t, signIn(adminEmail, password, "198.51.100.1")); res.StatusCode != http.StatusOK {
			t.Fatalf("sign-in %d: %d", i+1, res.StatusCode)
		}
	}
	if got := retryAfter(t, e.do(t, signIn(adminEmail, password, "198.51.100.1"))); got != 20 {
		t.Errorf("per-address Retry-After = %d, want 20 (3 a minute)", got)
	}
	for i := range 2 {
		if res := e.do(t, signIn(adminEmail, password, fmt.Sprintf("198.51.100.%d", i+2))); res.StatusCode != http.StatusOK {
			t.Fatalf("another address %d: %d", i+2, res.StatusCode)
		}
	}
	retryAfter(t, e.do(t, signIn(adminEmail, password, "198.51.100.9"))) // the sixth in one second
}

// Behind a trusted proxy the limits count the forwarded client address; from anyone
// else X-Forwarded-For is ignored (a client cannot pick a fresh address per attempt).
func TestSignInLimitsReadTheForwardedAddressOfTrustedProxiesOnly(t *testing.T) {
	proxies, err := forwarded.Parse("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	e := mustEnvWith(t, console.Limits{PerIP: 1, IPWindow: time.Minute}, console.HandlerOptions{Proxies: proxies})
	via := func(client, peer string) req {
		r := signIn(adminEmail, password, peer)
		r.header = map[string]string{"X-Forwarded-For": client}
		return r
	}
	if res := e.do(t, via("198.51.100.1", "10.1.2.3")); res.StatusCode != http.StatusOK {
		t.Fatalf("first client through the proxy: %d", res.StatusCode)
	}
	if res := e.do(t, via("198.51.100.2", "10.1.2.3")); res.StatusCode != http.StatusOK {
		t.Fatalf("second client through the proxy: %d", res.StatusCode)
	}
	retryAfter(t, e.do(t, via("198.51.100.1", "10.1.2.3")))
	if res := e.do(t, via("198.51.100.3", "203.0.113.5")); res.StatusCode != http.StatusOK {
		t.Fatalf("untrusted peer's first: %d", res.StatusCode)
	}
	retryAfter(t, e.do(t, via("198.51.100.4", "203.0.113.5"))) // its header ignored: the same address
}

// Behind a proxy that terminates TLS the cookie is Secure and __Host- prefixed when
// the trusted proxy says https, or always with SecureCookies; a client cannot claim
// https itself.
func TestSecureCookiesBehindProxies(t *testing.T) {
	proxies, _ := forwarded.Parse("10.0.0.0/8")
	for _, tc := range []struct {
		name       string
		hopt       console.HandlerOptions
		peer       string
		wantSecure bool
	}{
		{"proxy says https", console.HandlerOptions{Proxies: proxies}, "10.0.0.1", true},
		{"stranger says https", console.HandlerOptions{Proxies: proxies}, "203.0.113.5", false},
		{"secure cookies on", console.HandlerOptions{SecureCookies: true}, "203.0.113.5", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustEnvWith(t, console.Limits{}, tc.hopt)
			r := signIn(adminEmail, password, tc.peer)
			r.header = map[string]string{"X-Forwarded-Proto": "https"}
			res := e.do(t, r)
			c := sessionCookie(res)
			if res.StatusCode != http.StatusOK || c == nil {
				t.Fatalf("%d, cookie %v", res.StatusCode, c)
			}
			wantName := console.CookieName
			if tc.wantSecure {
				wantName = console.SecureCookieName
			}
			if c.Secure != tc.wantSecure || c.Name != wantName || c.Path != "/" || c.Domain != "" {
				t.Errorf("cookie %s Secure=%v Path=%q Domain=%q, want %s Secure=%v", c.Name, c.Secure, c.Path, c.Domain, wantName, tc.wantSecure)
			}
			// The session is read from the cookie of that name only.
			read := req{method: "GET", path: "/console/api/session", from: tc.peer, cookie: c.Value, cookieName: wantName,
				header: map[string]string{"X-Forwarded-Proto": "https"}}
			if res := e.do(t, read); res.StatusCode != http.StatusOK {
				t.Errorf("session with the %s cookie: %d", wantName, res.StatusCode)
			}
			read.cookieName = console.SecureCookieName // the other name
			if tc.wantSecure {
				read.cookieName = console.CookieName
			}
			if res := e.do(t, read); res.StatusCode != http.StatusNoContent {
				t.Errorf("session with the other cookie name: %d, want 204", res.StatusCode)
			}
		})
	}
}

// A user changes their own password with the CSRF token: every other session of the
// user ends, the answer is a new session, and the old password no longer signs in.
func TestChangeOwnPasswordEndsOtherSessions(t *testing.T) {
	e := mustEnv(t)
	mine, csrf := e.mustSignIn(t, adminEmail)
	other, _ := e.mustSignIn(t, adminEmail)
	viewer, _ := e.mustSignIn(t, viewerEmail)
	const next = "a much better passphrase"
	change := func(cur, csrf string) *http.Response {
		return e.do(t, req{method: "POST", path: "/console/api/password", cookie: mine, csrf: csrf,
			body: `{"current_password":"` + cur + `","new_password":"` + next + `"}`})
	}
	if res := change(password, ""); res.StatusCode != http.StatusForbidden {
		t.Fatalf("without the CSRF token: %d", res.StatusCode)
	}
	if res := change("not my password", csrf); res.StatusCode != http.StatusForbidden {
		t.Fatalf("wrong current password: %d %s", res.StatusCode, body(t, res))
	}
	if res := e.do(t, req{method: "POST", path: "/console/api/password", cookie: mine, csrf: csrf,
		body: `{"current_password":"` + password + `","new_password":"short"}`}); res.StatusCode != http.StatusBadRequest ||
		!json.Valid([]byte(body(t, res))) {
		t.Fatalf("too short a new password: %d", res.StatusCode)
	}
	res := change(password, csrf)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("change: %d %s", res.StatusCode, body(t, res))
	}
	c := sessionCookie(res)
	var s console.Session
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil || c == nil || c.Value == mine || s.CSRFToken == "" {
		t.Fatalf("the change gave no new session: %v %+v", c, s)
	}
	for name, id := range map[string]string{"the old session": mine, "the other session": other} {
		if res := e.do(t, req{method: "GET", path: "/console/api/session", cookie: id}); res.StatusCode != http.StatusNoContent {
			t.Errorf("%s after the change: %d, want 204", name, res.StatusCode)
		}
	}
	for name, id := range map[string]string{"the new session": c.Value, "another user's session": viewer} {
		if res := e.do(t, req{method: "GET", path: "/console/api/session", cookie: id}); res.StatusCode != http.StatusOK {
			t.Errorf("%s after the change: %d, want 200", name, res.StatusCode)
		}
	}
	if res := e.do(t, signIn(adminEmail, password, "")); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("old password: %d", res.StatusCode)
	}
	if res := e.do(t, signIn(adminEmail, next, "")); res.StatusCode != http.StatusOK {
		t.Errorf("new password: %d", res.StatusCode)
	}
}

// An operator or org admin setting a console password (tenants.SetConsolePassword)
// ends every session of that user.
func TestSetPasswordEndsSessions(t *testing.T) {
	e := mustEnv(t)
	id, _ := e.mustSignIn(t, adminEmail)
	if err := e.svc.SetConsolePassword(context.Background(), tenants.Actor{Name: "test"}, "acme", adminEmail, "a brand new passphrase"); err != nil {
		t.Fatal(err)
	}
	if res := e.do(t, req{method: "GET", path: "/console/api/session", cookie: id}); res.StatusCode != http.StatusNoContent {
		t.Errorf("session after the password was set: %d, want 204", res.StatusCode)
	}
}

// A cookie that names no session is looked up in Postgres once, then answered from
// memory; a malformed one never reaches Postgres.
func TestUnknownSessionsAreCachedNegatively(t *testing.T) {
	e := mustEnv(t)
	id, _ := e.mustSignIn(t, adminEmail)
	unknown := "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" // 32 zero bytes: well-formed, names nothing
	for range 3 {
		if res := e.do(t, req{method: "GET", path: "/v1/orgs/acme", cookie: unknown}); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("unknown session: %d", res.StatusCode)
		}
	}
	// Prove the second answer came from memory: make the id name a live session in
	// Postgres behind the cache's back; it is still refused within the minute.
	if _, err := e.pool.Exec(context.Background(), `UPDATE console_sessions SET id_hash = sha256($1::bytea)
		WHERE id_hash = sha256($2::bytea)`, []byte(unknown), []byte(id)); err != nil {
		t.Fatal(err)
	}
	if res := e.do(t, req{method: "GET", path: "/v1/orgs/acme", cookie: unknown}); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a cached unknown session: %d, want 401 from memory", res.StatusCode)
	}
}

// An IPv6 client counts by its /64: its 2^64 addresses are one client's.
func TestIPv6ClientsCountByTheirSlash64(t *testing.T) {
	e := mustEnvWith(t, console.Limits{PerIP: 2, IPWindow: time.Minute}, console.HandlerOptions{})
	for i, from := range []string{"[2001:db8:1:1::1]", "[2001:db8:1:1::2]"} {
		if res := e.do(t, signIn(adminEmail, password, from)); res.StatusCode != http.StatusOK {
			t.Fatalf("sign-in %d: %d", i+1, res.StatusCode)
		}
	}
	retryAfter(t, e.do(t, signIn(adminEmail, password, "[2001:db8:1:1:ffff::9]")))
	if res := e.do(t, signIn(adminEmail, password, "[2001:db8:1:2::1]")); res.StatusCode != http.StatusOK {
		t.Fatalf("another /64: %d", res.StatusCode)
	}
}
