package clienttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// slotApp is a service whose routes run under middleware.Concurrency: /ok answers
// 200, /fail 500, /panic panics, /report reports one request used, /block waits for
// unblock (deaf to its context, as a handler stuck in a call), /stream writes a chunk
// every 250 ms for streamFor. Each handler sends its reservation's id on ids.
type slotApp struct {
	ids       chan string
	unblock   chan struct{}
	returned  chan string // the ids of the /block handlers that returned
	streamFor time.Duration
	panics    chan any // what the panic wrapper recovered
	quit      chan struct{}
	quitOnce  sync.Once
}

// let lets one stuck /block handler go.
func (a *slotApp) let(t *testing.T) {
	t.Helper()
	select {
	case a.unblock <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("no /block handler to let go within 10 s")
	}
}

// stopOnFailure lets every stuck /block handler go when t has failed, so that
// closing the server does not wait for them forever: defer it after the server's
// Close.
func (a *slotApp) stopOnFailure(t *testing.T) {
	if t.Failed() {
		a.quitOnce.Do(func() { close(a.quit) })
	}
}

func newSlotApp() *slotApp {
	return &slotApp{ids: make(chan string, 64), unblock: make(chan struct{}), returned: make(chan string, 64), panics: make(chan any, 8), quit: make(chan struct{})}
}

func (a *slotApp) routes(h func(pattern string, fn http.HandlerFunc)) {
	id := func(r *http.Request) string {
		id := middleware.ReservationID(r.Context())
		a.ids <- id
		return id
	}
	h("/ok", func(w http.ResponseWriter, r *http.Request) { id(r); io.WriteString(w, "ok\n") })
	h("/fail", func(w http.ResponseWriter, r *http.Request) { id(r); http.Error(w, "boom", 500) })
	h("/panic", func(w http.ResponseWriter, r *http.Request) { id(r); panic("handler bug") })
	h("/report", func(w http.ResponseWriter, r *http.Request) {
		id(r)
		middleware.ReportUsage(r.Context(), 1)
		io.WriteString(w, "ok\n")
	})
	h("/block", func(w http.ResponseWriter, r *http.Request) {
		i := id(r)
		select {
		case <-a.unblock:
		case <-a.quit:
		}
		a.returned <- i
	})
	h("/stream", func(w http.ResponseWriter, r *http.Request) {
		id(r)
		for end := time.Now().Add(a.streamFor); time.Now().Before(end); {
			io.WriteString(w, "chunk\n")
			w.(http.Flusher).Flush()
			time.Sleep(250 * time.Millisecond)
		}
	})
}

// recovering answers 500 for a panic that went through the middleware, and records
// its value: the middleware must re-panic with the handler's.
func (a *slotApp) recovering(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				a.panics <- v
				w.WriteHeader(500)
			}
		}()
		h.ServeHTTP(w, r)
	})
}

// byUser reserves one request of the X-User user of team eng for ttl.
func byUser(org string, ttl time.Duration) middleware.ReserveFunc {
	return func(r *http.Request) (client.ReserveRequest, error) {
		u := r.Header.Get("X-User")
		if u == "" {
			return client.ReserveRequest{}, errors.New("no X-User header")
		}
		return client.ReserveRequest{Org: org, Team: "eng", User: u, Metric: "requests", Amount: 1, TTL: ttl}, nil
	}
}

// state is reservation id's state, read from the API.
func state(t *testing.T, c *client.Client, id string) string {
	t.Helper()
	r, err := c.GetReservation(context.Background(), id)
	if err != nil {
		t.Fatalf("GetReservation %s: %v", id, err)
	}
	return r.State
}

// waitState waits up to d for reservation id to reach want, and fails the test if it
// does not.
func waitState(t *testing.T, c *client.Client, id, want string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := state(t, c, id)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservation %s is %s after %v, want %s", id, got, d, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s within 10 s", what)
		var zero T
		return zero
	}
}

// The concurrency middleware in front of the standard mux and of chi gives its slot
// back whatever way the handler ends: it returns (200, or 500: an error), it panics
// (and the panic goes on, with its value), it reports usage (committed, not
// released); and when the client goes away or a timeout cancels the request's
// context, once the handler, still stuck, returns (not at the disconnect). Today's reservations are enough:
// each state is read with GET /v1/reservations/{id}, and the user's minute window,
// where the held request counted, is back to what was committed.
func TestConcurrencyMiddlewareReleases(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	app := newSlotApp()
	slots := middleware.Concurrency(c, byUser(e.org, 10*time.Second))

	mux := http.NewServeMux()
	app.routes(func(p string, fn http.HandlerFunc) { mux.Handle(p, slots(fn)) })
	r := chi.NewRouter()
	r.Use(app.recovering, slots)
	app.routes(func(p string, fn http.HandlerFunc) { r.Get(p, fn) })

	for _, srv := range []struct {
		name string
		h    http.Handler
	}{{"ServeMux", app.recovering(mux)}, {"chi", r}} {
		t.Run(srv.name, func(t *testing.T) {
			ts := httptest.NewServer(srv.h)
			defer ts.Close()
			defer app.stopOnFailure(t)
			for _, tc := range []struct {
				path, want string
				status     int
			}{{"/ok", client.StateReleased, 200}, {"/fail", client.StateReleased, 500}, {"/panic", client.StateReleased, 500},
				{"/report", client.StateCommitted, 200}} {
				before := e.used("requests", "user", "minute")
				res, _ := get(t, ts.URL+tc.path, "alice")
				id := recv(t, app.ids, "reservation id")
				if res.StatusCode != tc.status || id == "" {
					t.Fatalf("%s: %d, reservation %q", tc.path, res.StatusCode, id)
				}
				// Settled before the answer ended: no wait.
				if got := state(t, c, id); got != tc.want {
					t.Errorf("%s: reservation %s, want %s", tc.path, got, tc.want)
				}
				wantUsed := before
				if tc.want == client.StateCommitted {
					wantUsed++
				}
				if used := e.used("requests", "user", "minute"); used != wantUsed {
					t.Errorf("%s: alice's minute used %d, want %d", tc.path, used, wantUsed)
				}
			}
			if v := recv(t, app.panics, "re-panic"); v != "handler bug" {
				t.Errorf("the panic went on as %v, want the handler's", v)
			}

			// The client goes away: the slot stays held while the handler still runs,
			// and comes back when it returns; what the handler reports after the
			// disconnect is counted.
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/block", nil)
			req.Header.Set("X-User", "alice")
			errc := make(chan error, 1)
			go func() {
				res, err := http.DefaultClient.Do(req)
				if err == nil {
					res.Body.Close()
				}
				errc <- err
			}()
			id := recv(t, app.ids, "reservation id")
			if got := state(t, c, id); got != client.StateHeld {
				t.Fatalf("while the handler runs: %s", got)
			}
			cancel()
			<-errc
			time.Sleep(300 * time.Millisecond)
			if got := state(t, c, id); got != client.StateHeld {
				t.Errorf("the client went away, the handler still runs: %s, want held", got)
			}
			app.let(t)
			recv(t, app.returned, "the handler's return")
			waitState(t, c, id, client.StateReleased, 3*time.Second)
		})
	}

	// A timeout cancels the request's context (http.TimeoutHandler answers 503): the
	// slot is held until the handler, still stuck, returns.
	ts := httptest.NewServer(http.TimeoutHandler(mux, 300*time.Millisecond, "too slow"))
	defer ts.Close()
	defer app.stopOnFailure(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if res, _ := get(t, ts.URL+"/block", "bob"); res.StatusCode != 503 {
			t.Errorf("TimeoutHandler: %d", res.StatusCode)
		}
	}()
	id := recv(t, app.ids, "reservation id")
	<-done
	if got := state(t, c, id); got != client.StateHeld {
		t.Errorf("timed out, the handler still runs: %s, want held", got)
	}
	app.let(t)
	recv(t, app.returned, "the handler's return")
	waitState(t, c, id, client.StateReleased, 3*time.Second)
}

// Every slot taken: the next request is answered 429 with Retry-After, and never
// reaches the handler; once the holders return, their slots are back. Today the
// user's limit of 3 requests a minute bounds what is held at once as a concurrent
// limit will.
func TestConcurrencyMiddlewareDeniesWhenFull(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	app := newSlotApp()
	mux := http.NewServeMux()
	slots := middleware.Concurrency(c, byUser(e.org, 10*time.Second))
	app.routes(func(p string, fn http.HandlerFunc) { mux.Handle(p, slots(fn)) })
	ts := httptest.NewServer(mux)
	defer ts.Close()
	defer app.stopOnFailure(t)

	var wg sync.WaitGroup
	ids := make([]string, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if res, _ := get(t, ts.URL+"/block", "alice"); res.StatusCode != 200 {
				t.Errorf("holder %d: %d", i, res.StatusCode)
			}
		}()
		ids[i] = recv(t, app.ids, "reservation id")
	}
	res, body := get(t, ts.URL+"/ok", "alice")
	if res.StatusCode != 429 || res.Header.Get("Retry-After") == "" || res.Header.Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(body, `"level":"user"`) {
		t.Errorf("a fourth at once: %d %v %s", res.StatusCode, res.Header, body)
	}
	if len(app.ids) != 0 {
		t.Error("the denied request reached the handler")
	}
	for range 3 {
		app.let(t)
	}
	wg.Wait()
	for _, id := range ids {
		if got := state(t, c, id); got != client.StateReleased {
			t.Errorf("holder's reservation %s", got)
		}
	}
	if res, _ := get(t, ts.URL+"/ok", "alice"); res.StatusCode != 200 {
		t.Errorf("after the holders returned: %d", res.StatusCode)
	}
	recv(t, app.ids, "reservation id")
}

// Quotaplane down: FailClosed answers 503 (not 429) and runs nothing; FailOpen runs
// the handler holding nothing. A request the ReserveFunc cannot map is a 400.
func TestConcurrencyMiddlewareFailPolicy(t *testing.T) {
	ln := httptest.NewServer(http.NotFoundHandler())
	dead := ln.URL
	ln.Close()
	for _, tc := range []struct {
		policy client.FailPolicy
		want   int
	}{{client.FailClosed, 503}, {client.FailOpen, 200}} {
		down, _ := client.New(dead, "qpk_x", client.WithRetries(0), client.WithFailPolicy(tc.policy))
		app := newSlotApp()
		mux := http.NewServeMux()
		slots := middleware.Concurrency(down, byUser("acme", time.Minute))
		app.routes(func(p string, fn http.HandlerFunc) { mux.Handle(p, slots(fn)) })
		ts := httptest.NewServer(mux)
		start := time.Now()
		res, body := get(t, ts.URL+"/ok", "carol")
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("Quotaplane down stalled the request %v", took)
		}
		if res.StatusCode != tc.want || (tc.want == 503 && (!strings.Contains(body, `"status":503`) || res.Header.Get("Retry-After") == "")) {
			t.Errorf("want %d: %d %s", tc.want, res.StatusCode, body)
		}
		if tc.want == 200 {
			if id := recv(t, app.ids, "handler run"); id != "" {
				t.Errorf("fail open held %q", id)
			}
		} else if len(app.ids) != 0 {
			t.Error("fail closed ran the handler")
		}
		if res, body := get(t, ts.URL+"/ok", ""); res.StatusCode != 400 || !strings.Contains(body, "no X-User header") {
			t.Errorf("unmapped request: %d %s", res.StatusCode, body)
		}
		ts.Close()
	}
}

// --- The tests below need a server with the `concurrent` window, `amounts` / `used`
// maps and POST /v1/reservations/{id}/extend. On a server without them they fail.

// A stream that runs longer than its slot's ttl keeps it: the middleware extends it
// every third of the ttl. Without the extends the worker's sweep expires it at ttl.
// Needs POST /v1/reservations/{id}/extend.
func TestConcurrencyMiddlewareExtendsPastTTLNeedsMergedServer(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	app := newSlotApp()
	app.streamFor = 5 * time.Second
	mux := http.NewServeMux()
	slots := middleware.Concurrency(c, byUser(e.org, 2*time.Second))
	app.routes(func(p string, fn http.HandlerFunc) { mux.Handle(p, slots(fn)) })
	ts := httptest.NewServer(mux)
	defer ts.Close()
	done := make(chan string, 1)
	go func() {
		res, body := get(t, ts.URL+"/stream", "alice")
		done <- fmt.Sprint(res.StatusCode, " ", strings.Count(body, "chunk"))
	}()
	id := recv(t, app.ids, "reservation id")
	time.Sleep(3500 * time.Millisecond) // past the ttl, and a sweep
	r, err := c.GetReservation(context.Background(), id)
	if err != nil || r.State != client.StateHeld || !r.ExpiresAt.After(time.Now()) {
		t.Fatalf("at 3.5 s of a stream with a 2 s ttl: %+v, %v", r, err)
	}
	if got := recv(t, done, "the stream's end"); !strings.HasPrefix(got, "200 ") {
		t.Errorf("stream: %s", got)
	}
	if got := state(t, c, id); got != client.StateReleased {
		t.Errorf("after the stream: %s", got)
	}
}

// With a concurrent limit of 2 requests for each user of eng: two held slots fill it,
// a third is denied at the concurrent window, in-flight is 2 while they run and 0
// after, and a reservation of requests and tokens reports its real tokens. Needs the
// `concurrent` window and `amounts`.
func TestConcurrencyMiddlewareInFlightNeedsMergedServer(t *testing.T) {
	e := newEnv(t, "")
	org := testenv.ID(t, "cl2")
	e.op("POST", "/v1/plans", `{"id":"p-`+org+`","name":"P","fail_mode":"closed","limits":[
		{"metric":"requests","window":"concurrent","limit":4},{"metric":"requests","window":"minute","limit":100},
		{"metric":"tokens","window":"month","limit":100000}]}`, 201)
	e.op("POST", "/v1/orgs", `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	e.op("POST", "/v1/orgs/"+org+"/teams", `{"id":"eng","name":"Eng","user_limits":[{"metric":"requests","window":"concurrent","limit":2}]}`, 201)
	var k struct {
		Secret string `json:"secret"`
	}
	e.decode(e.op("POST", "/v1/orgs/"+org+"/api-keys", `{"name":"svc","scopes":["check"]}`, 201), &k)
	c, _ := client.New(e.url(), k.Secret)
	inFlight := func() int64 {
		t.Helper()
		res, err := c.Check(context.Background(), client.CheckRequest{Org: org, Team: "eng", User: "alice", Metric: "requests", Query: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range res.Levels {
			if l.Level == "user" && l.Window == "concurrent" {
				return l.Limit - l.Remaining // what open reservations hold
			}
		}
		t.Fatalf("no user concurrent level in %+v", res.Levels)
		return 0
	}

	app := newSlotApp()
	mux := http.NewServeMux()
	slots := middleware.Concurrency(c, func(r *http.Request) (client.ReserveRequest, error) {
		return client.ReserveRequest{Org: org, Team: "eng", User: r.Header.Get("X-User"), Amounts: map[string]int64{"requests": 1, "tokens": 4000}}, nil
	})
	app.routes(func(p string, fn http.HandlerFunc) { mux.Handle(p, slots(fn)) })
	mux.Handle("/llm", slots(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		middleware.ReportMetricUsage(r.Context(), "requests", 1)
		middleware.ReportMetricUsage(r.Context(), "tokens", 1234) // what the model reported
		io.WriteString(w, "ok\n")
	})))
	ts := httptest.NewServer(mux)
	defer ts.Close()
	defer app.stopOnFailure(t)

	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); get(t, ts.URL+"/block", "alice") }()
		recv(t, app.ids, "reservation id")
	}
	if n := inFlight(); n != 2 {
		t.Errorf("in flight with 2 held: %d", n)
	}
	res, body := get(t, ts.URL+"/ok", "alice")
	if res.StatusCode != 429 || !strings.Contains(body, `"window":"concurrent"`) {
		t.Errorf("a third at once: %d %s", res.StatusCode, body)
	}
	app.let(t)
	app.let(t)
	wg.Wait()
	if n := inFlight(); n != 0 {
		t.Errorf("in flight after the holders returned: %d", n)
	}
	if res, _ := get(t, ts.URL+"/llm", "alice"); res.StatusCode != 200 {
		t.Fatalf("/llm: %d", res.StatusCode)
	}
	q, err := c.Check(context.Background(), client.CheckRequest{Org: org, Team: "eng", User: "alice", Costs: map[string]int64{"requests": 1, "tokens": 1}, Query: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range q.Levels {
		if l.Level == "org" && l.Metric == "tokens" && l.Window == "month" && l.Used != 1234 {
			t.Errorf("tokens used %d, want the 1234 reported", l.Used)
		}
		if l.Window == "concurrent" && l.Remaining != l.Limit {
			t.Errorf("%s concurrent: %d of %d in flight after /llm", l.Level, l.Limit-l.Remaining, l.Limit)
		}
	}
}
