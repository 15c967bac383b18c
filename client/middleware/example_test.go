package middleware_test

import (
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
	"github.com/quotaplane/quotaplane/client/quotaplanetest"
)

// One check per request, with the standard mux (chi: r.Use(limit)).
func ExampleCheck() {
	qp, err := client.New("http://127.0.0.1:8080", os.Getenv("QUOTAPLANE_KEY"), client.WithFailPolicy(client.FailOpen))
	if err != nil {
		log.Fatal(err)
	}
	limit := middleware.Check(qp, func(r *http.Request) (client.CheckRequest, error) {
		if r.URL.Path == "/healthz" {
			return client.CheckRequest{}, middleware.ErrSkip
		}
		user := r.Header.Get("X-User") // in a real service: from its authentication
		if user == "" {
			return client.CheckRequest{}, http.ErrNoCookie
		}
		return client.CheckRequest{Org: "demo", Team: "eng", User: user}, nil
	})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /search", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("results\n")) })
	log.Fatal(http.ListenAndServe("127.0.0.1:8090", limit(mux)))
}

// Reserve the most a completion may cost, commit what it used.
func ExampleReserve() {
	qp, err := client.New("http://127.0.0.1:8080", os.Getenv("QUOTAPLANE_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	reserve := middleware.Reserve(qp, func(r *http.Request) (client.ReserveRequest, error) {
		return client.ReserveRequest{Org: "demo", User: r.Header.Get("X-User"), Team: "eng", Metric: "tokens", Amount: 4000}, nil
	})
	complete := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens := int64(1234) // what the model reported
		middleware.ReportUsage(r.Context(), tokens)
		_ = json.NewEncoder(w).Encode(map[string]int64{"tokens": tokens})
	})
	http.Handle("POST /complete", reserve(complete))
	log.Fatal(http.ListenAndServe("127.0.0.1:8090", nil))
}

// An LLM endpoint: each call holds one of its user's request slots (a concurrent
// limit) and the most tokens it may spend, extended while it streams, and settles with
// what the model reported; the slot comes back when the handler returns, panics or
// the client goes away. With chi: r.Use(slots).
func ExampleConcurrency() {
	qp, err := client.New("http://127.0.0.1:8080", os.Getenv("QUOTAPLANE_KEY"), client.WithFailPolicy(client.FailClosed))
	if err != nil {
		log.Fatal(err)
	}
	slots := middleware.Concurrency(qp, func(r *http.Request) (client.ReserveRequest, error) {
		return client.ReserveRequest{Org: "demo", Team: "eng", User: r.Header.Get("X-User"),
			Amounts: map[string]int64{"requests": 1, "tokens": 4000}, TTL: 30 * time.Second}, nil
	})
	chat := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens := int64(1234) // what the model reported, as the stream ends
		middleware.ReportMetricUsage(r.Context(), "requests", 1)
		middleware.ReportMetricUsage(r.Context(), "tokens", tokens)
		_ = json.NewEncoder(w).Encode(map[string]int64{"tokens": tokens})
	})
	http.Handle("POST /chat", slots(chat))
	log.Fatal(http.ListenAndServe("127.0.0.1:8090", nil))
}

// The handler reads the decision (as express-rate-limit's req.rateLimit); warn
// mode's warning is passed on. Run against quotaplanetest's fake api.
func ExampleDecisionFrom() {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(c quotaplanetest.Call) quotaplanetest.Verdict {
		return quotaplanetest.Verdict{Limit: 60, Remaining: 12, Warning: "over quota at user " + c.User}
	})
	limit := middleware.Check(qp.Client(), func(r *http.Request) (client.CheckRequest, error) {
		return client.CheckRequest{Org: "demo", Team: "eng", User: r.Header.Get("X-User")}, nil
	})
	search := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := middleware.DecisionFrom(r.Context())
		fmt.Fprintf(w, "%d of %d left\n", d.RateLimit.Remaining, d.RateLimit.Limit)
	})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/search", nil)
	req.Header.Set("X-User", "alice")
	limit(search).ServeHTTP(rec, req)
	fmt.Print(rec.Code, " ", rec.Body.String())
	fmt.Println("Quotaplane-Warning:", rec.Header().Get("Quotaplane-Warning"))
	// Output:
	// 200 12 of 60 left
	// Quotaplane-Warning: over quota at user alice
}

// A denial answered one's own way, and health probes skipped.
func ExampleWithOnDenied() {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(quotaplanetest.Call) quotaplanetest.Verdict {
		return quotaplanetest.Verdict{Deny: true, RetryAfter: 20 * time.Second}
	})
	limit := middleware.Check(qp.Client(), func(r *http.Request) (client.CheckRequest, error) {
		return client.CheckRequest{Org: "demo", Team: "eng", User: r.Header.Get("X-User")}, nil
	},
		middleware.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		middleware.WithOnDenied(func(w http.ResponseWriter, r *http.Request, d *middleware.Decision) {
			w.Header().Set("Retry-After", fmt.Sprint(int(d.RetryAfter.Seconds())))
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprintf(w, "over the %s %s limit, retry in %v\n", d.BlockedAt.Level, d.BlockedAt.Window, d.RetryAfter)
		}))
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	for _, path := range []string{"/search", "/healthz"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("X-User", "alice")
		limit(ok).ServeHTTP(rec, req)
		fmt.Print(path, " ", rec.Code, " ", rec.Body.String())
	}
	fmt.Println(len(qp.Requests()), "check")
	// Output:
	// /search 429 over the user minute limit, retry in 20s
	// /healthz 200 ok
	// 1 check
}
