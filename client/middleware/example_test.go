package middleware_test

import (
	"encoding/json"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
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
