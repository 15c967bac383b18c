package clienttest

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
)

// Reserve, Get, Commit (and its repeat), Release, and their errors, against the API's
// "Reservations" contract. Needs the reservations API (branch res).
func TestReservationClient(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	ctx := context.Background()
	req := client.ReserveRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens", Amount: 300, TTL: time.Minute}
	r, err := c.Reserve(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Allowed || r.ID == "" || r.State != client.StateHeld || r.Amount != 300 || r.OnExpiry != "commit" ||
		r.ExpiresAt.Before(time.Now().Add(50*time.Second)) || len(r.Levels) == 0 || r.RateLimit.Limit != 1000 {
		t.Fatalf("Reserve = %+v", r)
	}
	got, err := c.GetReservation(ctx, r.ID)
	if err != nil || got.State != client.StateHeld || got.Amount != 300 {
		t.Fatalf("GetReservation = %+v, %v", got, err)
	}
	done, err := c.Commit(ctx, r.ID, 100)
	if err != nil || done.State != client.StateCommitted || done.Used != 100 || done.Released != 200 || done.OverReserved != 0 {
		t.Fatalf("Commit = %+v, %v", done, err)
	}
	again, err := c.Commit(ctx, r.ID, 100)
	if err != nil || again.State != client.StateCommitted || again.Used != 100 {
		t.Errorf("repeated Commit = %+v, %v", again, err)
	}
	if used := e.used("tokens", "org", "month"); used != 100 {
		t.Errorf("tokens used %d, want 100", used)
	}

	r2, err := c.Reserve(ctx, req)
	if err != nil || !r2.Allowed {
		t.Fatalf("second Reserve = %+v, %v", r2, err)
	}
	rel, err := c.Release(ctx, r2.ID)
	if err != nil || rel.State != client.StateReleased {
		t.Fatalf("Release = %+v, %v", rel, err)
	}
	var pe *client.Error
	if _, err := c.Commit(ctx, r2.ID, 10); !errors.As(err, &pe) || pe.StatusCode != 409 || !strings.Contains(pe.Problem.Detail, "released") {
		t.Errorf("Commit after Release = %v, want 409 naming the state", err)
	}
	if _, err := c.GetReservation(ctx, "no-such-reservation"); !errors.As(err, &pe) || pe.StatusCode != 404 {
		t.Errorf("GetReservation of an unknown id = %v, want 404", err)
	}

	// Over quota: a denial, nothing held.
	big := req
	big.Amount = 950
	d, err := c.Reserve(ctx, big)
	if err != nil || d.Allowed || d.ID != "" || d.BlockedAt == nil || d.BlockedAt.Window != "month" || d.RetryAfter <= 0 {
		t.Errorf("Reserve over quota = %+v, %v", d, err)
	}
	if used := e.used("tokens", "org", "month"); used != 100 {
		t.Errorf("tokens used %d after a denied reservation, want 100", used)
	}
}

// The reserve middleware holds the request's amount, commits what the handler
// reported through the context (the whole amount when it reported nothing), and
// answers 429 when the amount cannot be held. Needs the reservations API (branch res).
func TestReservationMiddleware(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	settled := make(chan middleware.Settlement, 1)
	reserve := middleware.Reserve(c, func(r *http.Request) (client.ReserveRequest, error) {
		return client.ReserveRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens", Amount: 400}, nil
	}, middleware.WithOnSettled(func(_ *http.Request, s middleware.Settlement) { settled <- s }))
	var report int64 = -1 // -1: report nothing
	ts := httptest.NewServer(reserve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if report >= 0 && !middleware.ReportUsage(r.Context(), report) {
			t.Error("ReportUsage: no reservation in the request's context")
		}
		io.WriteString(w, "done\n")
	})))
	defer ts.Close()

	for _, step := range []struct {
		report     int64
		wantStatus int
		wantUsed   int64
	}{
		{150, 200, 150}, // reported 150 of 400: 250 given back
		{-1, 200, 550},  // reported nothing: the 400 reserved are committed
		{0, 200, 550},   // reported 0: everything given back
	} {
		report = step.report
		res, body := get(t, ts.URL, "alice")
		if res.StatusCode != step.wantStatus || body != "done\n" || res.Header.Get("RateLimit-Limit") != "1000" {
			t.Fatalf("report %d: %d %q %v", step.report, res.StatusCode, body, res.Header)
		}
		if s := recv(t, settled, "the settlement"); s.Err != nil { // off the response path
			t.Fatalf("report %d: %+v", step.report, s)
		}
		if used := e.used("tokens", "org", "month"); used != step.wantUsed {
			t.Errorf("after reporting %d: tokens used %d, want %d", step.report, used, step.wantUsed)
		}
	}
	// 550 used and 400 held fit (950); a second 400 held at once does not: 429.
	e2 := e.client()
	held, err := e2.Reserve(context.Background(), client.ReserveRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens", Amount: 400})
	if err != nil || !held.Allowed {
		t.Fatalf("Reserve = %+v, %v", held, err)
	}
	res, body := get(t, ts.URL, "alice")
	if res.StatusCode != 429 || res.Header.Get("Retry-After") == "" || res.Header.Get("RateLimit-Remaining") == "" ||
		res.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, `"window":"month"`) {
		t.Errorf("over quota: %d %v %s", res.StatusCode, res.Header, body)
	}
}

// A reservation whose reply is lost is retried with its idempotency key and answered
// from the first: the amount is held once. Needs the reservations API (branch res).
func TestReservationLostReplyHeldOnce(t *testing.T) {
	e := newEnv(t, "")
	proxy := newDropFirstReply(t, e.st.APIAddr)
	c, _ := client.New("http://"+proxy.ln.Addr().String(), e.key, client.WithBackoff(10*time.Millisecond))
	ctx := context.Background()
	r, err := c.Reserve(ctx, client.ReserveRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens", Amount: 300})
	if err != nil {
		t.Fatal(err)
	}
	if !proxy.dropped.Load() || !r.Allowed || !r.Replayed || r.ID == "" {
		t.Fatalf("dropped %v; Reserve = %+v, want held and replayed", proxy.dropped.Load(), r)
	}
	// 300 held once leaves 700 of the month's 1000: 650 fits (it would not after 600).
	more, err := e.client().Reserve(ctx, client.ReserveRequest{Org: e.org, Team: "eng", User: "alice", Metric: "tokens", Amount: 650})
	if err != nil || !more.Allowed {
		t.Errorf("a second reservation of 650 = %+v, %v: the first was held twice", more, err)
	}
}
