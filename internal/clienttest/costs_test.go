package clienttest

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// Costs, Amounts, CommitUsed and Extend against API.md "Several metrics in one
// decision" and "Concurrency limits". Needs a server with costs, amounts, used maps
// and POST /v1/reservations/{id}/extend; on a server without them it fails.
func TestSeveralMetricsNeedsMergedServer(t *testing.T) {
	e := newEnv(t, "")
	c := e.client()
	ctx := context.Background()

	// Tokens over the month's 1000: denied at tokens, and no request counted anywhere.
	d, err := c.Check(ctx, client.CheckRequest{Org: e.org, Team: "eng", User: "alice", Costs: map[string]int64{"requests": 1, "tokens": 2000}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.BlockedAt == nil || d.BlockedAt.Metric != "tokens" || d.BlockedAt.Window != "month" {
		t.Fatalf("Check over tokens = %+v", d)
	}
	for _, l := range []string{"org", "user"} {
		if used := e.used("requests", l, "minute"); used != 0 {
			t.Errorf("a denied check counted %d requests at %s", used, l)
		}
	}
	ok, err := c.Check(ctx, client.CheckRequest{Org: e.org, Team: "eng", User: "alice", Costs: map[string]int64{"requests": 1, "tokens": 100}})
	if err != nil || !ok.Allowed {
		t.Fatalf("Check = %+v, %v", ok, err)
	}
	metrics := map[string]bool{}
	for _, l := range ok.Levels {
		metrics[l.Metric] = true
	}
	if !metrics["requests"] || !metrics["tokens"] {
		t.Errorf("levels name metrics %v", metrics)
	}

	// A reservation of both, extended, settled with the real tokens.
	r, err := c.Reserve(ctx, client.ReserveRequest{Org: e.org, Team: "eng", User: "alice", Amounts: map[string]int64{"requests": 1, "tokens": 400}, TTL: 10 * time.Second})
	if err != nil || !r.Allowed || r.ID == "" || !reflect.DeepEqual(r.Amounts, map[string]int64{"requests": 1, "tokens": 400}) {
		t.Fatalf("Reserve = %+v, %v", r, err)
	}
	ext, err := c.Extend(ctx, r.ID, 2*time.Minute)
	if err != nil || ext.State != client.StateHeld || !ext.ExpiresAt.After(time.Now().Add(100*time.Second)) {
		t.Fatalf("Extend = %+v, %v", ext, err)
	}
	done, err := c.CommitUsed(ctx, r.ID, map[string]int64{"requests": 1, "tokens": 123})
	if err != nil || done.State != client.StateCommitted || done.UsedByMetric["tokens"] != 123 || done.UsedByMetric["requests"] != 1 {
		t.Fatalf("CommitUsed = %+v, %v", done, err)
	}
	if used := e.used("tokens", "org", "month"); used != 223 {
		t.Errorf("tokens used %d, want 100 + 123", used)
	}
	if _, err := c.Extend(ctx, r.ID, time.Minute); err == nil {
		t.Error("Extend of a committed reservation succeeded, want 409")
	}
}
