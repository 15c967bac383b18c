// Command go-service is an example service that checks its callers' quota with
// Quotaplane through the Go client's middleware:
//
//	QUOTAPLANE_KEY=qpk_... go run ./examples/go-service
//	curl -i localhost:8090/search -H 'X-User: alice'
//	curl -i -X POST localhost:8090/complete -H 'X-User: alice' -d 'write a haiku'
//
// GET /search costs one request of the caller (X-User, in team QUOTAPLANE_TEAM of org
// QUOTAPLANE_ORG); POST /complete reserves 2000 tokens, "generates" a reply, and
// commits the tokens it used. Over quota, both answer 429 with Retry-After and
// RateLimit-*. When Quotaplane cannot be reached, /search fails open and /complete
// closed (503).
//
// Settings: QUOTAPLANE_URL (default http://127.0.0.1:8080), QUOTAPLANE_KEY (an org key
// with the check scope), QUOTAPLANE_ORG (demo), QUOTAPLANE_TEAM (eng), ADDR
// (127.0.0.1:8090).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context) error {
	key := os.Getenv("QUOTAPLANE_KEY")
	if key == "" {
		return errors.New("set QUOTAPLANE_KEY to an org key with the check scope")
	}
	org, team := getenv("QUOTAPLANE_ORG", "demo"), getenv("QUOTAPLANE_TEAM", "eng")
	// Cheap reads fail open; costly work fails closed.
	policy := func(_ context.Context, req client.CheckRequest, err error) bool {
		allow := req.Metric == "" // a check of requests, not a reservation of tokens
		log.Printf("quota of %s not decided (allowed: %v): %v", req.User, allow, err)
		return allow
	}
	qp, err := client.New(getenv("QUOTAPLANE_URL", "http://127.0.0.1:8080"), key,
		client.WithTimeout(time.Second), client.WithFailPolicy(policy))
	if err != nil {
		return err
	}
	caller := func(r *http.Request) (string, error) {
		u := r.Header.Get("X-User") // a real service takes it from its authentication
		if u == "" {
			return "", errors.New("send the caller's id in X-User")
		}
		return u, nil
	}
	perRequest := middleware.Check(qp, func(r *http.Request) (client.CheckRequest, error) {
		u, err := caller(r)
		return client.CheckRequest{Org: org, Team: team, User: u}, err
	})
	perToken := middleware.Reserve(qp, func(r *http.Request) (client.ReserveRequest, error) {
		u, err := caller(r)
		return client.ReserveRequest{Org: org, Team: team, User: u, Metric: "tokens", Amount: 2000, TTL: time.Minute}, err
	})

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.Handle("GET /search", perRequest(http.HandlerFunc(search)))
	mux.Handle("POST /complete", perToken(http.HandlerFunc(complete)))

	srv := &http.Server{Addr: getenv("ADDR", "127.0.0.1:8090"), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Printf("go-service listening on %s", srv.Addr)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	}
}

func search(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "results for %s\n", r.URL.Query().Get("q"))
}

// complete stands in for an LLM call: it "uses" 10 tokens a word of the prompt and
// reports them, so the middleware commits those and gives back the rest of the 2000.
func complete(w http.ResponseWriter, r *http.Request) {
	prompt, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	used := int64(10 * len(strings.Fields(string(prompt))))
	middleware.ReportUsage(r.Context(), used)
	fmt.Fprintf(w, "a reply to %q (%d tokens)\n", prompt, used)
}
