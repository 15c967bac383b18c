package middleware_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
)

// api answers the reservation calls of middleware.Concurrency as API.md says and
// records them in order, with their bodies: the timing the middleware owns (beats,
// the release at once, bounded waits) tested without a server. internal/clienttest
// runs the same middleware against the real api.
type api struct {
	mu       sync.Mutex
	calls    []string      // "POST /v1/reservations/r_1/extend {...}"
	extend   int           // the status /extend answers (200 unless set)
	hangOn   string        // a method+path that never answers until the test ends
	released chan struct{} // closed at the first DELETE
	once     sync.Once
	srv      *httptest.Server
}

func newAPI(t *testing.T) *api {
	a := &api{extend: 200, released: make(chan struct{})}
	stop := make(chan struct{})
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		k := r.Method + " " + r.URL.Path
		a.mu.Lock()
		a.calls = append(a.calls, strings.TrimSpace(k+" "+string(b)))
		hang, extend := a.hangOn == k, a.extend
		a.mu.Unlock()
		if hang {
			<-stop
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case k == "POST /v1/reservations":
			w.WriteHeader(201)
			io.WriteString(w, `{"id": "r_1", "state": "held", "amount": 1, "expires_at": "2030-01-01T00:00:00Z", "levels": []}`)
		case strings.HasSuffix(k, "/extend") && extend != 200:
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(extend)
			io.WriteString(w, `{"type": "x", "title": "Conflict", "status": 409, "detail": "reservation r_1 is expired"}`)
		case strings.HasSuffix(k, "/extend"):
			io.WriteString(w, `{"id": "r_1", "state": "held", "expires_at": "2030-01-01T00:00:00Z"}`)
		case r.Method == "DELETE":
			a.once.Do(func() { close(a.released) })
			io.WriteString(w, `{"id": "r_1", "state": "released"}`)
		default: // commit
			io.WriteString(w, `{"id": "r_1", "state": "committed", "used": 1}`)
		}
	}))
	t.Cleanup(func() { close(stop); a.srv.Close() })
	return a
}

func (a *api) log() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.calls...)
}

func (a *api) count(prefix string) int {
	n := 0
	for _, c := range a.log() {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

func slots(t *testing.T, a *api, ttl time.Duration, opts ...middleware.Option) func(http.Handler) http.Handler {
	c, err := client.New(a.srv.URL, "k", client.WithRetries(0), client.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return middleware.Concurrency(c, func(r *http.Request) (client.ReserveRequest, error) {
		return client.ReserveRequest{Org: "acme", User: "alice", Metric: "requests", Amount: 1, TTL: ttl}, nil
	}, opts...)
}

// While the handler runs, the reservation is extended every beat by its ttl; it is
// released once when the handler returns, and never extended after.
func TestConcurrencyHeartbeat(t *testing.T) {
	a := newAPI(t)
	h := slots(t, a, 2*time.Second, middleware.WithHeartbeat(40*time.Millisecond))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if middleware.ReservationID(r.Context()) != "r_1" {
			t.Error("no reservation id in the handler's context")
		}
		time.Sleep(300 * time.Millisecond)
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	log := a.log()
	if rec.Code != 200 || len(log) < 5 || !strings.Contains(log[0], `"on_expiry":"release"`) || !strings.Contains(log[0], `"ttl_seconds":2`) ||
		log[1] != `POST /v1/reservations/r_1/extend {"ttl_seconds":2}` || log[len(log)-1] != "DELETE /v1/reservations/r_1" {
		t.Fatalf("%d, calls %q", rec.Code, log)
	}
	n := a.count("POST /v1/reservations/r_1/extend")
	time.Sleep(150 * time.Millisecond)
	if a.count("POST /v1/reservations/r_1/extend") != n || a.count("DELETE") != 1 {
		t.Errorf("calls after the release: %q", a.log())
	}
}

// An extend answered 409 (the reservation expired) ends the beats.
func TestConcurrencyHeartbeatStopsWhenLost(t *testing.T) {
	a := newAPI(t)
	a.extend = 409
	h := slots(t, a, time.Second, middleware.WithHeartbeat(30*time.Millisecond))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(250 * time.Millisecond)
	}))
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	if n := a.count("POST /v1/reservations/r_1/extend"); n != 1 {
		t.Errorf("%d extends after a 409, want 1: %q", n, a.log())
	}
}

// The request's context ends (the client went away) while the handler still works:
// the slot is held (no longer extended) until the handler returns, and what it
// reported after the disconnect is committed with the rest, not lost.
func TestConcurrencySettlesWhenTheHandlerIsDoneNotOnCancel(t *testing.T) {
	a := newAPI(t)
	unblock := make(chan struct{})
	returned := make(chan struct{})
	h := slots(t, a, 30*time.Second, middleware.WithHeartbeat(30*time.Millisecond))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		middleware.ReportUsage(r.Context(), 10)
		<-unblock
		middleware.ReportUsage(r.Context(), 80) // after the client went away
	}))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		defer close(returned)
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	time.Sleep(200 * time.Millisecond)
	if n := a.count("DELETE") + a.count("POST /v1/reservations/r_1/commit"); n != 0 {
		t.Fatalf("settled while the handler still ran: %q", a.log())
	}
	// The beats stopped with the request's context: a handler that never returned
	// would lose its slot at the ttl.
	beats := a.count("POST /v1/reservations/r_1/extend")
	time.Sleep(100 * time.Millisecond)
	if a.count("POST /v1/reservations/r_1/extend") != beats {
		t.Errorf("extends go on after the request's context ended: %q", a.log())
	}
	close(unblock)
	<-returned
	log := a.log()
	if last := log[len(log)-1]; last != `POST /v1/reservations/r_1/commit {"used":90}` || a.count("DELETE") != 0 {
		t.Errorf("calls %q, want a commit of all 90 units reported", log)
	}
}

// A panic releases the slot, then goes on with its own value.
func TestConcurrencyPanic(t *testing.T) {
	a := newAPI(t)
	h := slots(t, a, 30*time.Second)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { panic("handler bug") }))
	func() {
		defer func() {
			if v := recover(); v != "handler bug" {
				t.Errorf("recovered %v, want the handler's panic", v)
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}()
	if a.count("DELETE") != 1 {
		t.Errorf("calls %q", a.log())
	}
}

// Reported usage is committed instead of released: one metric as a number, several as
// an object.
func TestConcurrencyCommitsReportedUsage(t *testing.T) {
	for _, tc := range []struct {
		report func(ctx context.Context)
		want   string
	}{
		{func(ctx context.Context) { middleware.ReportUsage(ctx, 1) }, `{"used":1}`},
		{func(ctx context.Context) {
			middleware.ReportMetricUsage(ctx, "tokens", 1000)
			middleware.ReportMetricUsage(ctx, "tokens", 234)
			middleware.ReportMetricUsage(ctx, "requests", 1)
		}, `{"used":{"requests":1,"tokens":1234}}`},
	} {
		a := newAPI(t)
		h := slots(t, a, 30*time.Second)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tc.report(r.Context()) }))
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
		log := a.log()
		if last := log[len(log)-1]; last != "POST /v1/reservations/r_1/commit "+tc.want || a.count("DELETE") != 0 {
			t.Errorf("calls %q, want a commit of %s", log, tc.want)
		}
	}
}

// A Quotaplane that never answers the release does not hold the response past
// WithSettleTimeout.
func TestConcurrencySettleIsBounded(t *testing.T) {
	a := newAPI(t)
	a.hangOn = "DELETE /v1/reservations/r_1"
	h := slots(t, a, 30*time.Second, middleware.WithSettleTimeout(200*time.Millisecond))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	start := time.Now()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	if took := time.Since(start); took > 900*time.Millisecond {
		t.Errorf("the handler's return waited %v for a release that never answers", took)
	}
}
