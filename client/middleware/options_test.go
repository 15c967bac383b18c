package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
	"github.com/quotaplane/quotaplane/client/quotaplanetest"
)

// byUser maps a request to a check of its X-User of team eng.
func byUser(r *http.Request) (client.CheckRequest, error) {
	u := r.Header.Get("X-User")
	if u == "" {
		return client.CheckRequest{}, errors.New("no X-User header")
	}
	return client.CheckRequest{Org: "acme", Team: "eng", User: u}, nil
}

func reserveByUser(r *http.Request) (client.ReserveRequest, error) {
	return client.ReserveRequest{Org: "acme", Team: "eng", User: r.Header.Get("X-User"), Metric: "tokens", Amount: 100}, nil
}

// serve runs h on one request of user and returns the recorder.
func serve(h http.Handler, user string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/work", nil)
	if user != "" {
		req.Header.Set("X-User", user)
	}
	h.ServeHTTP(rec, req)
	return rec
}

// logs is a slog.Logger writing JSON lines into a buffer.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.Write(p) }
func (l *logs) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }
func (l *logs) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Every option of the middlewares, against quotaplanetest's fake api (internal/clienttest
// runs them against the real api, with chi too).
func TestOptions(t *testing.T) {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(c quotaplanetest.Call) quotaplanetest.Verdict {
		switch c.User {
		case "bob":
			return quotaplanetest.Verdict{Deny: true, RetryAfter: 7 * time.Second, Limit: 3}
		case "carol": // not registered, no team: the api's 400
			return quotaplanetest.Verdict{Status: 400, Detail: "team: required for a user that is not registered"}
		case "dave":
			return quotaplanetest.Verdict{Warning: `over quota at user "dave" (minute window)`}
		case "erin":
			return quotaplanetest.Verdict{Status: 503, Detail: "redis down"}
		}
		return quotaplanetest.Verdict{Limit: 10, Remaining: 4}
	})
	c := qp.Client(client.WithRetries(0))
	var seen *middleware.Decision
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = middleware.DecisionFrom(r.Context())
		io.WriteString(w, "done\n")
	})

	t.Run("DecisionFrom", func(t *testing.T) {
		seen = nil
		rec := serve(middleware.Check(c, byUser)(handler), "alice")
		if rec.Code != 200 || seen == nil || !seen.Allowed || seen.RateLimit.Remaining != 4 || seen.Check == nil || len(seen.Levels) != 1 {
			t.Errorf("%d, decision %+v", rec.Code, seen)
		}
		seen = nil
		rec = serve(middleware.Reserve(c, reserveByUser)(handler), "alice")
		if rec.Code != 200 || seen == nil || !seen.Allowed || seen.Reservation == nil || seen.Reservation.ID == "" {
			t.Errorf("Reserve: %d, decision %+v", rec.Code, seen)
		}
	})
	t.Run("warn mode's Quotaplane-Warning is passed on", func(t *testing.T) {
		rec := serve(middleware.Check(c, byUser)(handler), "dave")
		if rec.Code != 200 || rec.Header().Get("Quotaplane-Warning") != `over quota at user "dave" (minute window)` || seen.Mode != "warn" {
			t.Errorf("%d, headers %v, decision %+v", rec.Code, rec.Header(), seen)
		}
	})
	t.Run("WithSkip", func(t *testing.T) {
		skip := middleware.WithSkip(func(r *http.Request) bool { return r.Header.Get("X-Internal") != "" })
		n := len(qp.Requests())
		req := httptest.NewRequest("GET", "/work", nil)
		req.Header.Set("X-Internal", "1")
		rec := httptest.NewRecorder()
		middleware.Check(c, byUser, skip)(handler).ServeHTTP(rec, req)
		if rec.Code != 200 || len(qp.Requests()) != n || rec.Header().Get("RateLimit-Limit") != "" {
			t.Errorf("skipped: %d, %d calls to the api", rec.Code, len(qp.Requests())-n)
		}
		if rec := serve(middleware.Check(c, byUser, skip)(handler), "bob"); rec.Code != 429 {
			t.Errorf("not skipped: %d", rec.Code)
		}
	})
	t.Run("WithOnDenied", func(t *testing.T) {
		var got *middleware.Decision
		onDenied := middleware.WithOnDenied(func(w http.ResponseWriter, r *http.Request, d *middleware.Decision) {
			got = d
			w.WriteHeader(http.StatusPaymentRequired)
			io.WriteString(w, "upgrade your plan\n")
		})
		for name, mw := range map[string]func(http.Handler) http.Handler{
			"Check":   middleware.Check(c, byUser, onDenied),
			"Reserve": middleware.Reserve(c, reserveByUser, onDenied),
		} {
			got = nil
			rec := serve(mw(handler), "bob")
			if rec.Code != 402 || rec.Body.String() != "upgrade your plan\n" || got == nil || got.Allowed || got.RetryAfter != 7*time.Second ||
				rec.Header()["RateLimit-Policy"] == nil {
				t.Errorf("%s: %d %q, decision %+v", name, rec.Code, rec.Body, got)
			}
		}
		// The default: 429 problem.
		if rec := serve(middleware.Check(c, byUser)(handler), "bob"); rec.Code != 429 || rec.Header().Get("Retry-After") != "7" ||
			rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("default: %d %v", rec.Code, rec.Header())
		}
	})
	t.Run("WithErrorHandler", func(t *testing.T) {
		var got error
		custom := middleware.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			w.WriteHeader(418)
		})
		rec := serve(middleware.Check(c, byUser, custom)(handler), "carol")
		var pe *client.Error
		if rec.Code != 418 || !errors.As(got, &pe) || pe.StatusCode != 400 {
			t.Errorf("%d, err %v", rec.Code, got)
		}
		rec = serve(middleware.Check(c, byUser, custom)(handler), "")
		if rec.Code != 418 || !errors.Is(got, middleware.ErrRequest) {
			t.Errorf("unmapped: %d, err %v", rec.Code, got)
		}
	})
	// The default error handler: a problem document, never a 500 for the api's 4xx,
	// and the cause logged.
	t.Run("DefaultErrorHandler", func(t *testing.T) {
		bad, _ := client.New(qp.URL, "not the key")
		for _, tc := range []struct {
			name, user string
			c          middleware.Quota
			status     int
			detail     string
			level      string
		}{
			{"unregistered user", "carol", c, 403, "team: required for a user that is not registered", "WARN"},
			{"the service's key refused", "alice", bad, 500, "credentials", "ERROR"}, // the service's fault, as in TypeScript
			{"unmapped request", "", c, 400, "no X-User header", "DEBUG"},
			{"no decision", "erin", c, 503, "", "WARN"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var l logs
				for _, mw := range []func(http.Handler) http.Handler{
					middleware.Check(tc.c, byUser, middleware.WithLogger(l.logger())),
					middleware.Reserve(tc.c, func(r *http.Request) (client.ReserveRequest, error) {
						cr, err := byUser(r)
						return client.ReserveRequest{Org: cr.Org, Team: cr.Team, User: cr.User, Amount: 1}, err
					}, middleware.WithLogger(l.logger())),
				} {
					rec := serve(mw(handler), tc.user)
					var p middleware.Problem
					if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || rec.Code != tc.status || p.Status != tc.status ||
						rec.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(p.Detail, tc.detail) {
						t.Errorf("%d %s: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
					}
					if strings.Contains(p.Detail, "invalid API key") {
						t.Errorf("the service's key problem passed on to its caller: %s", p.Detail)
					}
				}
				if out := l.String(); !strings.Contains(out, `"level":"`+tc.level+`"`) || !strings.Contains(out, `"err":`) {
					t.Errorf("logged %s", out)
				}
			})
		}
	})
}

// The client goes away while the check is in flight: the check is abandoned (its
// request cancelled), nothing is written, the handler never runs.
func TestCheckAbortsWhenTheClientGoesAway(t *testing.T) {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(quotaplanetest.Call) quotaplanetest.Verdict { return quotaplanetest.Verdict{Hang: true} })
	var ran bool
	h := middleware.Check(qp.Client(client.WithFailPolicy(client.FailOpen)), byUser)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran = true }))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/work", nil).WithContext(ctx)
	req.Header.Set("X-User", "alice")
	start := time.Now()
	h.ServeHTTP(rec, req)
	if ran || rec.Body.Len() != 0 || time.Since(start) > 500*time.Millisecond {
		t.Errorf("handler ran %v, wrote %q, after %v", ran, rec.Body, time.Since(start))
	}
}

// Reserve settles off the response path: a commit that never answers does not hold
// the response, and the settle runs without the request's cancellation.
func TestReserveSettlesOffTheResponsePath(t *testing.T) {
	a := newAPI(t)
	a.hangOn = "POST /v1/reservations/r_1/commit"
	c, _ := client.New(a.srv.URL, "k", client.WithRetries(0))
	settled := make(chan middleware.Settlement, 1)
	var returned time.Time
	h := middleware.Reserve(c, reserveByUser, middleware.WithSettleTimeout(time.Second),
		middleware.WithOnSettled(func(_ *http.Request, s middleware.Settlement) { settled <- s }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			middleware.ReportUsage(r.Context(), 5)
			returned = time.Now()
		}))
	ctx, cancel := context.WithCancel(context.Background())
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	cancel() // the request ends: the commit goes on
	if took := time.Since(returned); took > 400*time.Millisecond {
		t.Errorf("the response waited %v after the handler for the commit", took)
	}
	s := <-settled
	if s.How != "commit" || s.Used != 5 || !errors.Is(s.Err, context.DeadlineExceeded) || time.Since(returned) < 900*time.Millisecond {
		t.Errorf("settlement %+v after %v; want the commit of 5 cut by its own timeout, not the request's cancel", s, time.Since(returned))
	}
}

// What Reserve commits: success commits what was reported (it adds) or the whole
// amount; a failure (a 5xx written, a panic) commits what was reported so far, and
// releases when nothing was.
func TestReserveSettlementRule(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler func(w http.ResponseWriter, r *http.Request)
		state   string
		used    int64
		failed  bool
	}{
		{"reported, twice", func(w http.ResponseWriter, r *http.Request) {
			middleware.ReportUsage(r.Context(), 30)
			middleware.ReportUsage(r.Context(), 12)
		}, client.StateCommitted, 42, false},
		{"nothing reported", func(w http.ResponseWriter, r *http.Request) {}, client.StateCommitted, 100, false},
		{"a 500 after a report", func(w http.ResponseWriter, r *http.Request) {
			middleware.ReportUsage(r.Context(), 30)
			w.WriteHeader(500)
		}, client.StateCommitted, 30, true},
		{"a 502, nothing reported", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(502) }, client.StateReleased, 0, true},
		{"a panic after a report", func(w http.ResponseWriter, r *http.Request) {
			middleware.ReportUsage(r.Context(), 7)
			panic("handler bug")
		}, client.StateCommitted, 7, true},
		{"a panic, nothing reported", func(w http.ResponseWriter, r *http.Request) { panic("handler bug") }, client.StateReleased, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qp := quotaplanetest.NewServer()
			defer qp.Close()
			settled := make(chan middleware.Settlement, 1)
			h := middleware.Reserve(qp.Client(), reserveByUser,
				middleware.WithOnSettled(func(_ *http.Request, s middleware.Settlement) { settled <- s }))(http.HandlerFunc(tc.handler))
			func() {
				defer func() {
					if v := recover(); v != nil && v != "handler bug" {
						t.Errorf("recovered %v", v)
					}
				}()
				serve(h, "alice")
			}()
			s := <-settled
			res, _ := qp.Reservation(s.ReservationID)
			if res.State != tc.state || res.Used != tc.used || s.Failed != tc.failed || s.Err != nil {
				t.Errorf("reservation %s used %d, settlement %+v; want %s used %d", res.State, res.Used, s, tc.state, tc.used)
			}
		})
	}
}

// A stream the client leaves: the handler goes on and reports after the disconnect;
// Reserve commits everything it reported, not only what came before the close.
func TestReserveStreamingDisconnectCountsWhatWasReported(t *testing.T) {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	settled := make(chan middleware.Settlement, 1)
	gone := make(chan struct{})
	h := middleware.Reserve(qp.Client(), reserveByUser,
		middleware.WithOnSettled(func(_ *http.Request, s middleware.Settlement) { settled <- s }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for i := 0; i < 9; i++ {
				if i == 3 {
					<-gone
				}
				middleware.ReportUsage(r.Context(), 10) // the model produced 10 more tokens
				io.WriteString(w, "chunk\n")
				w.(http.Flusher).Flush()
				time.Sleep(10 * time.Millisecond)
			}
		}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	req.Header.Set("X-User", "alice")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(res.Body, buf); err != nil {
		t.Fatal(err)
	}
	cancel() // the client goes away after the first chunk
	res.Body.Close()
	close(gone)
	s := <-settled
	r, _ := qp.Reservation(s.ReservationID)
	if s.How != "commit" || s.Used != 90 || r.Used != 90 {
		t.Errorf("settlement %+v, reservation used %d; want all 90 reported units committed", s, r.Used)
	}
}

// A hung api in front of a handler: the fail policy answers within the client's
// budget, and the handler runs (FailOpen) or the request is answered 503 (FailClosed).
func TestHungAPIAnsweredWithinTheBudget(t *testing.T) {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(quotaplanetest.Call) quotaplanetest.Verdict { return quotaplanetest.Verdict{Hang: true} })
	for _, tc := range []struct {
		policy client.FailPolicy
		want   int
	}{{client.FailOpen, 200}, {client.FailClosed, 503}} {
		c := qp.Client(client.WithBudget(300*time.Millisecond), client.WithFailPolicy(tc.policy))
		start := time.Now()
		rec := serve(middleware.Check(c, byUser)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})), "alice")
		if took := time.Since(start); rec.Code != tc.want || took < 250*time.Millisecond || took > time.Second {
			t.Errorf("%d after %v; want %d after the 300 ms budget", rec.Code, took, tc.want)
		}
	}
}
