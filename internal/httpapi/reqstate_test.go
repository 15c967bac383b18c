package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

// idOf is the request id a handler under mw sees, for a request with the given
// X-Request-Id ("" for none).
func idOf(mw func(http.Handler) http.Handler, given string) string {
	var id string
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if given != "" {
		r.Header.Set(middleware.RequestIDHeader, given)
	}
	mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		id = middleware.GetReqID(r.Context())
	})).ServeHTTP(httptest.NewRecorder(), r)
	return id
}

// begin's request ids are chi's RequestID's: the same prefix, the next number of the
// same counter, six digits at least, and the client's X-Request-Id when it sends one.
func TestRequestStateIDIsChis(t *testing.T) {
	chi := idOf(middleware.RequestID, "")
	ours := idOf(begin, "")
	cut := strings.LastIndexByte(chi, '-')
	if cut < 0 || !strings.HasPrefix(ours, chi[:cut+1]) {
		t.Fatalf("ids %q (chi) and %q (begin): prefixes differ", chi, ours)
	}
	n, err1 := strconv.Atoi(chi[cut+1:])
	m, err2 := strconv.Atoi(ours[cut+1:])
	if err1 != nil || err2 != nil || m != n+1 || len(ours[cut+1:]) < 6 {
		t.Errorf("ids %q (chi) and %q (begin): want the next number, six digits at least", chi, ours)
	}
	if got := idOf(begin, "client-id-1"); got != "client-id-1" {
		t.Errorf("X-Request-Id client-id-1: id %q", got)
	}
	s := &requestState{id: 7}
	if got := s.requestID(); got != reqIDPrefix+"-000007" {
		t.Errorf("id 7 = %q", got)
	}
	s.id = 1234567
	if got := s.requestID(); got != reqIDPrefix+"-1234567" {
		t.Errorf("id 1234567 = %q", got)
	}
}

// authenticate's principal reaches the handler through the state, and through a
// context value outside begin.
func TestRequestStatePrincipal(t *testing.T) {
	p := principal{key: tenants.APIKey{ID: "k1", OrgID: "acme"}}
	var got principal
	h := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { got = callerOf(r) })
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { authenticated(h, w, r, p) })
	for _, name := range []string{"begin", "bare"} {
		got = principal{}
		var mw http.Handler = inner
		if name == "begin" {
			mw = begin(inner)
		}
		mw.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
		if got.key.ID != "k1" || got.key.OrgID != "acme" {
			t.Errorf("%s: callerOf = %+v", name, got)
		}
	}
}

// statusWriter reports the status chi's WrapResponseWriter reported, for the metrics.
func TestStatusWriterLikeChis(t *testing.T) {
	for _, tc := range []struct {
		name string
		do   func(w http.ResponseWriter)
	}{
		{"nothing", func(http.ResponseWriter) {}},
		{"write only", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")) }},
		{"404 twice", func(w http.ResponseWriter) { w.WriteHeader(404); w.WriteHeader(500) }},
		{"103 then 201", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(201) }},
		{"flush", func(w http.ResponseWriter) { w.(http.Flusher).Flush() }},
	} {
		chiW := middleware.NewWrapResponseWriter(httptest.NewRecorder(), 1)
		tc.do(chiW)
		ours := &statusWriter{ResponseWriter: httptest.NewRecorder()}
		tc.do(ours)
		if ours.Status() != chiW.Status() {
			t.Errorf("%s: status %d, chi's %d", tc.name, ours.Status(), chiW.Status())
		}
	}
}
