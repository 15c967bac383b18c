package clienttest

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
)

// warnOrg creates a second org on e's stack, in warn mode, with its own check key,
// and the team eng whose users have 3 requests a minute.
func (e *env) warnOrg() (org, key string) {
	org = e.org + "w"
	e.op("POST", "/v1/orgs", `{"id":"`+org+`","name":"W","plan":"p-`+e.org+`","mode":"warn"}`, 201)
	e.op("POST", "/v1/orgs/"+org+"/teams", `{"id":"eng","name":"Eng","user_limits":[{"metric":"requests","window":"minute","limit":3}]}`, 201)
	var k struct {
		Secret string `json:"secret"`
	}
	e.decode(e.op("POST", "/v1/orgs/"+org+"/api-keys", `{"name":"svc","scopes":["check"]}`, 201), &k)
	return org, k.Secret
}

// Every option of the Check middleware against the real api, in front of the
// standard mux and of chi: WithSkip, WithOnDenied, WithErrorHandler and the default
// one (an unregistered user without a team, which the api refuses 400, answers a 403
// problem document, never a 500), DecisionFrom, and warn mode's Quotaplane-Warning.
func TestMiddlewareOptions(t *testing.T) {
	e := newEnv(t, "")
	warnOrg, warnKey := e.warnOrg()
	c := e.client()
	wc, _ := client.New(e.url(), warnKey)
	check := func(org string) middleware.CheckFunc {
		return func(r *http.Request) (client.CheckRequest, error) {
			req := client.CheckRequest{Org: org, Team: r.Header.Get("X-Team"), User: r.Header.Get("X-User")}
			if req.User == "" {
				return req, errors.New("no X-User header")
			}
			return req, nil
		}
	}
	decisions := make(chan *middleware.Decision, 16)
	hello := func(w http.ResponseWriter, r *http.Request) {
		d, ok := middleware.DecisionFrom(r.Context())
		if !ok {
			d = nil
		}
		decisions <- d
		io.WriteString(w, "hello\n")
	}
	var handled []error
	opts := []middleware.Option{
		middleware.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		middleware.WithOnDenied(func(w http.ResponseWriter, r *http.Request, d *middleware.Decision) {
			w.Header().Set("X-Denied-At", d.BlockedAt.Level+"-"+d.BlockedAt.Window)
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, "slow down\n")
		}),
	}
	custom := middleware.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
		handled = append(handled, err)
		w.WriteHeader(http.StatusTeapot)
	})

	routers := func(mw func(http.Handler) http.Handler) map[string]http.Handler {
		mux := http.NewServeMux()
		mux.HandleFunc("GET /hello", hello)
		mux.HandleFunc("GET /healthz", hello)
		r := chi.NewRouter()
		r.Use(mw)
		r.Get("/hello", hello)
		r.Get("/healthz", hello)
		return map[string]http.Handler{"ServeMux": mw(mux), "chi": r}
	}
	call := func(t *testing.T, url, team, user string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("X-User", user)
		req.Header.Set("X-Team", team)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, string(b)
	}
	users := map[string]string{"ServeMux": "alice", "chi": "bob"}
	for name, h := range routers(middleware.Check(c, check(e.org), opts...)) {
		t.Run(name, func(t *testing.T) {
			ts := httptest.NewServer(h)
			defer ts.Close()
			user := users[name]
			for i := 1; i <= 3; i++ {
				res, _ := call(t, ts.URL+"/hello", "eng", user)
				d := <-decisions
				if res.StatusCode != 200 || d == nil || !d.Allowed || d.Check == nil || d.RateLimit.Remaining != int64(3-i) {
					t.Fatalf("request %d: %d, decision %+v", i, res.StatusCode, d)
				}
			}
			// WithOnDenied answers the fourth.
			res, body := call(t, ts.URL+"/hello", "eng", user)
			if res.StatusCode != 429 || body != "slow down\n" || res.Header.Get("X-Denied-At") != "user-minute" {
				t.Errorf("denied: %d %q %v", res.StatusCode, body, res.Header)
			}
			// WithSkip: no check (alice is over quota, and no X-User is needed).
			if res, _ := call(t, ts.URL+"/healthz", "", ""); res.StatusCode != 200 || res.Header.Get("RateLimit-Limit") != "" {
				t.Errorf("skipped: %d %v", res.StatusCode, res.Header)
			} else if d := <-decisions; d != nil {
				t.Errorf("a skipped request has a decision: %+v", d)
			}
			// The default error handler: carol is not registered, and names no team.
			res, body = call(t, ts.URL+"/hello", "", "carol")
			var p middleware.Problem
			if err := json.Unmarshal([]byte(body), &p); err != nil || res.StatusCode != 403 || p.Status != 403 ||
				res.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(p.Detail, "team") {
				t.Errorf("unregistered user: %d %s %s", res.StatusCode, res.Header.Get("Content-Type"), body)
			}
		})
	}
	// WithErrorHandler gets the api's refusal as a *client.Error.
	for name, h := range routers(middleware.Check(c, check(e.org), custom)) {
		ts := httptest.NewServer(h)
		handled = nil
		res, _ := call(t, ts.URL+"/hello", "", "carol")
		ts.Close()
		var pe *client.Error
		if res.StatusCode != 418 || len(handled) != 1 || !errors.As(handled[0], &pe) || pe.StatusCode != 400 {
			t.Errorf("%s: custom error handler: %d, %v", name, res.StatusCode, handled)
		}
	}
	// Warn mode: over quota, served, with Quotaplane-Warning passed on.
	for name, h := range routers(middleware.Check(wc, check(warnOrg))) {
		ts := httptest.NewServer(h)
		var warned *http.Response
		for range 4 {
			warned, _ = call(t, ts.URL+"/hello", "eng", "dave-"+name)
			<-decisions
		}
		ts.Close()
		if warned.StatusCode != 200 || warned.Header.Get("Quotaplane-Warning") == "" {
			t.Errorf("%s: warn mode over quota: %d, headers %v", name, warned.StatusCode, warned.Header)
		}
	}
}

// A stream the client leaves after its first chunk: the handler goes on and reports
// units after the disconnect. Reserve and Concurrency, in Go and TypeScript, both
// commit all it reported, once it is done, not only what came before the disconnect.
func TestStreamingDisconnectCountsWhatWasReported(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	for _, tc := range []struct {
		name string
		mw   func(middleware.ReserveFunc, ...middleware.Option) func(http.Handler) http.Handler
	}{
		{"Reserve", func(f middleware.ReserveFunc, o ...middleware.Option) func(http.Handler) http.Handler {
			return middleware.Reserve(c, f, o...)
		}},
		{"Concurrency", func(f middleware.ReserveFunc, o ...middleware.Option) func(http.Handler) http.Handler {
			return middleware.Concurrency(c, f, o...)
		}},
	} {
		for _, router := range []string{"ServeMux", "chi"} {
			t.Run(tc.name+" "+router, func(t *testing.T) {
				before := e.used("tokens", "org", "month")
				settled := make(chan middleware.Settlement, 1)
				gone := make(chan struct{})
				mw := tc.mw(func(r *http.Request) (client.ReserveRequest, error) {
					return client.ReserveRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens", Amount: 200}, nil
				}, middleware.WithOnSettled(func(_ *http.Request, s middleware.Settlement) { settled <- s }))
				stream := func(w http.ResponseWriter, r *http.Request) {
					middleware.ReportUsage(r.Context(), 10)
					io.WriteString(w, "chunk\n")
					w.(http.Flusher).Flush()
					<-gone
					for range 8 { // the model goes on: 80 more tokens
						time.Sleep(20 * time.Millisecond)
						middleware.ReportUsage(r.Context(), 10)
						io.WriteString(w, "chunk\n")
					}
				}
				var h http.Handler
				if router == "chi" {
					r := chi.NewRouter()
					r.Use(mw)
					r.Get("/", stream)
					h = r
				} else {
					mux := http.NewServeMux()
					mux.Handle("GET /", mw(http.HandlerFunc(stream)))
					h = mux
				}
				ts := httptest.NewServer(h)
				defer ts.Close()
				ctx, cancel := context.WithCancel(context.Background())
				req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/", nil)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 6)
				if _, err := io.ReadFull(res.Body, buf); err != nil {
					t.Fatal(err)
				}
				cancel()
				res.Body.Close()
				time.Sleep(100 * time.Millisecond) // the server sees the disconnect
				close(gone)
				s := recv(t, settled, "the settlement")
				if s.How != "commit" || s.Used != 90 || s.Err != nil {
					t.Errorf("settlement %+v, want a commit of the 90 reported", s)
				}
				if r, err := c.GetReservation(context.Background(), s.ReservationID); err != nil || r.State != client.StateCommitted || r.Used != 90 {
					t.Errorf("reservation %+v, %v", r, err)
				}
				if used := e.used("tokens", "org", "month"); used != before+90 {
					t.Errorf("tokens used %d, want %d", used, before+90)
				}
			})
		}
	}
}

// The caller's cancel, against the real api: ctx's error, never the fail policy.
func TestCallerCancelIsNotAFailure(t *testing.T) {
	e := newEnv(t, "")
	c := e.client(client.WithFailPolicy(client.FailOpen))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := c.Check(ctx, client.CheckRequest{Org: e.org, Team: "eng", User: "alice"})
	if !errors.Is(err, context.Canceled) || errors.Is(err, client.ErrUnavailable) || res != nil {
		t.Errorf("Check = %+v, %v; want context.Canceled", res, err)
	}
	if used := e.used("requests", "user", "minute"); used != 0 {
		t.Errorf("a cancelled check counted %d", used)
	}
}
