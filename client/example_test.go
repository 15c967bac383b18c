package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/quotaplanetest"
)

// A check before the work: a denial is a result, not an error.
func ExampleClient_Check() {
	qp, err := client.New("http://127.0.0.1:8080", os.Getenv("QUOTAPLANE_KEY"),
		client.WithTimeout(500*time.Millisecond), client.WithFailPolicy(client.FailOpen))
	if err != nil {
		log.Fatal(err)
	}
	res, err := qp.Check(context.Background(), client.CheckRequest{Org: "demo", User: "alice", Cost: 1})
	var pe *client.Error
	switch {
	case errors.As(err, &pe):
		log.Fatalf("refused: %d %s (%v)", pe.StatusCode, pe.Problem.Detail, pe.Problem.Errors)
	case err != nil:
		log.Fatal(err)
	case res.NotDecided:
		fmt.Println("Quotaplane is unreachable; failing open:", res.Cause)
	case !res.Allowed:
		fmt.Printf("over quota at %s %s (%s); retry in %v\n", res.BlockedAt.Level, res.BlockedAt.ID, res.BlockedAt.Window, res.RetryAfter)
	default:
		fmt.Printf("allowed: %d of %d left\n", res.RateLimit.Remaining, res.RateLimit.Limit)
	}
}

// A fail policy of one's own: cheap reads go on when Quotaplane cannot decide, costly
// work does not.
func ExampleFailPolicy() {
	policy := func(ctx context.Context, req client.CheckRequest, err error) bool {
		log.Printf("quota check of %s/%s not decided: %v", req.Org, req.Metric, err)
		return req.Metric == "requests"
	}
	qp, err := client.New("http://127.0.0.1:8080", os.Getenv("QUOTAPLANE_KEY"), client.WithFailPolicy(policy))
	if err != nil {
		log.Fatal(err)
	}
	_ = qp
}

// Several checks in one round trip, each decided on its own.
func ExampleClient_CheckBatch() {
	qp, err := client.New("http://127.0.0.1:8080", os.Getenv("QUOTAPLANE_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	items, err := qp.CheckBatch(context.Background(), []client.CheckRequest{
		{Org: "demo", User: "alice"},
		{Org: "demo", User: "bob", Metric: "tokens", Cost: 800},
	})
	if err != nil {
		log.Fatal(err)
	}
	for i, it := range items {
		if it.Err != nil {
			fmt.Println(i, "not decided:", it.Err.Problem.Detail)
			continue
		}
		fmt.Println(i, "allowed:", it.Result.Allowed)
	}
}

// Hold the most an LLM call may cost, then count what it used.
func ExampleClient_Reserve() {
	qp, err := client.New("http://127.0.0.1:8080", os.Getenv("QUOTAPLANE_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	r, err := qp.Reserve(ctx, client.ReserveRequest{Org: "demo", User: "alice", Metric: "tokens", Amount: 4000,
		TTL: 2 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	if !r.Allowed {
		fmt.Println("over quota; retry in", r.RetryAfter)
		return
	}
	used := int64(1234) // the tokens the model really used
	done, err := qp.Commit(ctx, r.ID, used)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(done.State, done.Used, "used,", done.Released, "given back")
}

// A check against quotaplanetest's fake api, with hooks counting attempts and
// retries: the first answer is a 503, the retry is allowed.
func ExampleWithHooks() {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	calls := 0
	qp.Decide(func(quotaplanetest.Call) quotaplanetest.Verdict {
		calls++
		if calls == 1 {
			return quotaplanetest.Verdict{Status: 503, Detail: "too many checks in flight"}
		}
		return quotaplanetest.Verdict{Limit: 60, Remaining: 59}
	})
	attempts, retries := 0, 0
	c := qp.Client(client.WithBackoff(time.Millisecond), client.WithHooks(client.Hooks{
		OnAttempt: func(context.Context, client.AttemptInfo) { attempts++ },
		OnRetry:   func(context.Context, client.RetryInfo) { retries++ },
	}))
	res, err := c.Check(context.Background(), client.CheckRequest{Org: "demo", Team: "eng", User: "alice"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("allowed:", res.Allowed, "remaining:", res.RateLimit.Remaining, "attempts:", attempts, "retries:", retries)
	fmt.Println("User-Agent:", qp.Requests()[0].Header.Get("User-Agent") == client.UserAgent)
	// Output:
	// allowed: true remaining: 59 attempts: 2 retries: 1
	// User-Agent: true
}

// The caller's own deadline is the caller giving up: an error wrapping
// context.DeadlineExceeded, never the fail policy's answer.
func ExampleClient_Check_callerDeadline() {
	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(quotaplanetest.Call) quotaplanetest.Verdict { return quotaplanetest.Verdict{Hang: true} })
	c := qp.Client(client.WithFailPolicy(client.FailOpen))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := c.Check(ctx, client.CheckRequest{Org: "demo", User: "alice"})
	fmt.Println(errors.Is(err, context.DeadlineExceeded), errors.Is(err, client.ErrUnavailable))
	// Output: true false
}
