package httpapi_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// rawExchange sends one HTTP/1.1 request to srv over TCP and returns the answer's
// header block and body exactly as they crossed the wire.
func rawExchange(t *testing.T, srv *httptest.Server, method, path, token, body string) (head, payload string) {
	t.Helper()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
	if token != "" {
		req += "Authorization: Bearer " + token + "\r\n"
	}
	if body != "" {
		req += "Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		t.Fatal(err)
	}
	head, payload, _ = strings.Cut(string(raw), "\r\n\r\n")
	return head, payload
}

// The legacy rate limit fields are spelled RateLimit-Limit, -Remaining and -Reset on
// the wire, on the admin routes (a 429 included) as on the checks (the admin routes
// sent Go's canonical Ratelimit-Limit: httprate sets them with Header.Set).
func TestRateLimitFieldsAreSpelledAlikeOnTheWire(t *testing.T) {
	f := mustRateLimited(t, 2)
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	admin, key := f.tokens["acme-admin"], f.tokens["acme-check"]
	for i, ex := range []struct{ method, path, token, body, status string }{
		{"GET", "/v1/orgs/acme/teams", admin, "", "200"},
		{"POST", "/v1/check", key, `{"org":"acme","metric":"requests","cost":1}`, "200"},
		{"GET", "/v1/orgs/acme/teams", admin, "", "200"},
		{"GET", "/v1/orgs/acme/teams", admin, "", "429"},
	} {
		head, _ := rawExchange(t, srv, ex.method, ex.path, ex.token, ex.body)
		if !strings.HasPrefix(head, "HTTP/1.1 "+ex.status) {
			t.Fatalf("answer %d: %q, want %s", i, head, ex.status)
		}
		for _, name := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
			if !strings.Contains(head, "\r\n"+name+": ") {
				t.Errorf("%s %s (%s): no %s field in\n%s", ex.method, ex.path, ex.status, name, head)
			}
		}
		if strings.Contains(head, "Ratelimit") {
			t.Errorf("%s %s (%s): a field spelled Ratelimit in\n%s", ex.method, ex.path, ex.status, head)
		}
	}
}

// Answers write <, > and & as they are, not as encoding/json's HTML escapes: a 401
// says "Bearer <token>" (it said "Bearer \u003ctoken\u003e"), and a team named
// "R&D <core>" reads so.
func TestAnswersDoNotEscapeHTML(t *testing.T) {
	f := mustFixture(t)
	srv := httptest.NewServer(f.h)
	defer srv.Close()
	head, body := rawExchange(t, srv, "GET", "/v1/orgs/acme", "", "")
	if !strings.HasPrefix(head, "HTTP/1.1 401") || !strings.Contains(body, "Bearer <token>") || strings.Contains(body, `\u003c`) {
		t.Errorf("401 without credentials: %s", body)
	}
	head, body = rawExchange(t, srv, "POST", "/v1/orgs/acme/teams", f.tokens["acme-admin"], `{"id":"rd","name":"R&D <core>"}`)
	if !strings.HasPrefix(head, "HTTP/1.1 201") || !strings.Contains(body, `"name":"R&D <core>"`) ||
		!strings.Contains(head, "\r\nX-Content-Type-Options: nosniff") {
		t.Errorf("team named R&D <core>: %s\n%s", head, body)
	}
	if rec := f.do("GET", "/v1/orgs/acme/teams/rd", f.tokens["acme-admin"], ""); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"R&D <core>"`) {
		t.Errorf("GET the team: %d %s", rec.Code, rec.Body)
	}
}
