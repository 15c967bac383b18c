package quotaplanetest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
	"github.com/quotaplane/quotaplane/client/quotaplanetest"
)

// A fake Quotaplane whose decisions the test scripts: bob is over quota.
func ExampleServer() {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(c quotaplanetest.Call) quotaplanetest.Verdict {
		if c.User == "bob" {
			return quotaplanetest.Verdict{Deny: true, RetryAfter: 30 * time.Second, Limit: 10}
		}
		return quotaplanetest.Verdict{Limit: 10, Remaining: 7}
	})
	c := qp.Client()
	for _, user := range []string{"alice", "bob"} {
		res, err := c.Check(context.Background(), client.CheckRequest{Org: "demo", Team: "eng", User: user})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: allowed %v, remaining %d, retry after %v\n", user, res.Allowed, res.RateLimit.Remaining, res.RetryAfter)
	}
	fmt.Println(len(qp.Requests()), "requests, the first to", qp.Requests()[0].Path)
	// Output:
	// alice: allowed true, remaining 7, retry after 0s
	// bob: allowed false, remaining 0, retry after 30s
	// 2 requests, the first to /v1/check
}

// A Quotaplane answering 503 with a Retry-After longer than the call's budget: the
// fail policy answers at once, without a retry.
func ExampleServer_unavailable() {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(quotaplanetest.Call) quotaplanetest.Verdict {
		return quotaplanetest.Verdict{Status: 503, RetryAfter: 5 * time.Second, Detail: "too many checks in flight"}
	})
	c := qp.Client(client.WithFailPolicy(client.FailOpen))
	res, err := c.Check(context.Background(), client.CheckRequest{Org: "demo", User: "alice"})
	fmt.Println(res.Allowed, res.NotDecided, err, len(qp.Requests()), "attempt")
	// Output: true true <nil> 1 attempt
}

// A user's handler under the reserve middleware, tested without an api: Noop holds
// every reservation, and the handler reads its decision.
func ExampleNoop() {
	complete := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		middleware.ReportUsage(r.Context(), 120)
		d, _ := middleware.DecisionFrom(r.Context())
		fmt.Fprintf(w, "allowed %v, reservation %s\n", d.Allowed, middleware.ReservationID(r.Context()))
	})
	settled := make(chan middleware.Settlement, 1)
	h := middleware.Reserve(quotaplanetest.Noop{}, func(r *http.Request) (client.ReserveRequest, error) {
		return client.ReserveRequest{Org: "demo", User: "alice", Metric: "tokens", Amount: 4000}, nil
	}, middleware.WithOnSettled(func(_ *http.Request, s middleware.Settlement) { settled <- s }))(complete)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/complete", nil))
	body, _ := io.ReadAll(rec.Body)
	s := <-settled
	fmt.Print(rec.Code, " ", string(body))
	fmt.Println(s.How, s.Used)
	// Output:
	// 200 allowed true, reservation noop
	// commit 120
}
