package client_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// recorder is an HTTP server that records each request's method, path and JSON body
// and answers each path with a fixed status and body: what the client sends for
// API.md "Several metrics in one decision" and "Concurrency limits", and how it reads
// their answers. (internal/clienttest runs the same calls against the real api.)
type recorder struct {
	mu   sync.Mutex
	got  map[string]any // "METHOD path" -> the body, decoded
	srv  *httptest.Server
	resp map[string]string // "METHOD path" -> status and body: "201 {...}"
}

func newRecorder(t *testing.T, resp map[string]string) *recorder {
	rec := &recorder{got: map[string]any{}, resp: resp}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := r.Method + " " + r.URL.Path
		b, _ := io.ReadAll(r.Body)
		var v any
		_ = json.Unmarshal(b, &v)
		rec.mu.Lock()
		rec.got[k] = v
		rec.mu.Unlock()
		answer, ok := resp[k]
		if !ok {
			http.NotFound(w, r)
			return
		}
		code, body, _ := strings.Cut(answer, " ")
		status, _ := strconv.Atoi(code)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) body(k string) map[string]any {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	m, _ := rec.got[k].(map[string]any)
	return m
}

func TestCostsOnTheWire(t *testing.T) {
	rec := newRecorder(t, map[string]string{
		"POST /v1/check": `200 {"allowed": true, "mode": "enforce", "levels": [
			{"level": "user", "id": "alice", "metric": "requests", "window": "minute", "limit": 60, "used": 1, "remaining": 59, "reset_at": "2030-01-01T00:00:00Z"},
			{"level": "user", "id": "alice", "metric": "tokens", "window": "concurrent", "limit": 8000, "used": 1200, "remaining": 6800, "reset_at": "2030-01-01T00:00:00Z"}]}`,
		"POST /v1/check/batch": `200 {"results": [{"allowed": false, "mode": "enforce", "levels": [
			{"level": "org", "id": "acme", "metric": "tokens", "window": "month", "limit": 10, "used": 10, "remaining": 0, "reset_at": "2030-01-01T00:00:00Z"}],
			"blocked_at": {"level": "org", "id": "acme", "metric": "tokens", "window": "month"}, "retry_after_seconds": 7}]}`,
	})
	c, _ := client.New(rec.srv.URL, "k")
	ctx := context.Background()
	res, err := c.Check(ctx, client.CheckRequest{Org: "acme", User: "alice", Costs: map[string]int64{"requests": 1, "tokens": 1200}})
	if err != nil {
		t.Fatal(err)
	}
	body := rec.body("POST /v1/check")
	if !reflect.DeepEqual(body["costs"], map[string]any{"requests": 1.0, "tokens": 1200.0}) || body["cost"] != nil || body["metric"] != nil || body["idempotency_key"] == nil {
		t.Errorf("sent %v", body)
	}
	if len(res.Levels) != 2 || res.Levels[0].Metric != "requests" || res.Levels[1].Metric != "tokens" || res.Levels[1].Window != "concurrent" {
		t.Errorf("levels %+v", res.Levels)
	}
	// A query of several metrics sends each at 0.
	if _, err := c.Check(ctx, client.CheckRequest{Org: "acme", Costs: map[string]int64{"requests": 1, "tokens": 5}, Query: true}); err != nil {
		t.Fatal(err)
	}
	if body := rec.body("POST /v1/check"); !reflect.DeepEqual(body["costs"], map[string]any{"requests": 0.0, "tokens": 0.0}) || body["cost"] != nil {
		t.Errorf("query sent %v", body)
	}

	items, err := c.CheckBatch(ctx, []client.CheckRequest{{Org: "acme", Costs: map[string]int64{"tokens": 3}}})
	if err != nil {
		t.Fatal(err)
	}
	checks, _ := rec.body("POST /v1/check/batch")["checks"].([]any)
	if len(checks) != 1 || !reflect.DeepEqual(checks[0].(map[string]any)["costs"], map[string]any{"tokens": 3.0}) {
		t.Errorf("batch sent %v", checks)
	}
	r := items[0].Result
	want := client.LevelRef{Level: "org", ID: "acme", Metric: "tokens", Window: "month"}
	if r == nil || r.Allowed || r.BlockedAt == nil || *r.BlockedAt != want || r.RetryAfter != 7*time.Second || r.RateLimit.Limit != 10 {
		t.Errorf("batch result %+v", r)
	}
}

func TestReservationOfSeveralMetricsOnTheWire(t *testing.T) {
	rec := newRecorder(t, map[string]string{
		"POST /v1/reservations": `201 {"id": "r_1", "state": "held", "metric": "requests", "amount": 1,
			"metrics": [{"metric": "requests", "amount": 1}, {"metric": "tokens", "amount": 4000}],
			"expires_at": "2030-01-01T00:00:30Z", "on_expiry": "release", "levels": []}`,
		"POST /v1/reservations/r_1/commit": `200 {"id": "r_1", "state": "committed", "metric": "requests", "amount": 1,
			"used": 1, "released": 0, "over_reserved": 0, "metrics": [
			{"metric": "requests", "amount": 1, "used": 1, "released": 0, "over_reserved": 0},
			{"metric": "tokens", "amount": 4000, "used": 1234, "released": 2766, "over_reserved": 0}]}`,
		"POST /v1/reservations/r_3/commit": `200 {"id": "r_3", "state": "committed", "used": {"requests": 1, "tokens": 5}}`,
		"POST /v1/reservations/r_1/extend": `200 {"id": "r_1", "state": "held", "expires_at": "2030-01-01T00:01:00Z"}`,
		"POST /v1/reservations/r_2/commit": `200 {"id": "r_2", "state": "committed", "amount": 10, "used": 4, "released": 6, "over_reserved": 0}`,
	})
	c, _ := client.New(rec.srv.URL, "k")
	ctx := context.Background()
	r, err := c.Reserve(ctx, client.ReserveRequest{Org: "acme", User: "alice", Amounts: map[string]int64{"requests": 1, "tokens": 4000},
		TTL: 1500 * time.Millisecond, OnExpiry: "release"})
	if err != nil {
		t.Fatal(err)
	}
	body := rec.body("POST /v1/reservations")
	if !reflect.DeepEqual(body["amounts"], map[string]any{"requests": 1.0, "tokens": 4000.0}) || body["amount"] != nil || body["metric"] != nil ||
		body["ttl_seconds"] != 2.0 || body["on_expiry"] != "release" {
		t.Errorf("sent %v", body)
	}
	if !r.Allowed || r.ID != "r_1" || !reflect.DeepEqual(r.Amounts, map[string]int64{"requests": 1, "tokens": 4000}) {
		t.Errorf("Reserve = %+v", r)
	}
	done, err := c.CommitUsed(ctx, "r_1", map[string]int64{"tokens": 1234, "requests": 1})
	if err != nil {
		t.Fatal(err)
	}
	if body := rec.body("POST /v1/reservations/r_1/commit"); !reflect.DeepEqual(body, map[string]any{"used": map[string]any{"requests": 1.0, "tokens": 1234.0}}) {
		t.Errorf("commit sent %v", body)
	}
	if done.State != client.StateCommitted || done.Used != 1 || len(done.Metrics) != 2 ||
		!reflect.DeepEqual(done.UsedByMetric, map[string]int64{"requests": 1, "tokens": 1234}) ||
		!reflect.DeepEqual(done.ReleasedByMetric, map[string]int64{"requests": 0, "tokens": 2766}) {
		t.Errorf("CommitUsed = %+v", done)
	}
	ext, err := c.Extend(ctx, "r_1", 200*time.Millisecond) // at least 1 s
	if err != nil {
		t.Fatal(err)
	}
	if body := rec.body("POST /v1/reservations/r_1/extend"); !reflect.DeepEqual(body, map[string]any{"ttl_seconds": 1.0}) {
		t.Errorf("extend sent %v", body)
	}
	if !ext.ExpiresAt.Equal(time.Date(2030, 1, 1, 0, 1, 0, 0, time.UTC)) {
		t.Errorf("Extend = %+v", ext)
	}
	// used as an object is read too, summed.
	if r3, err := c.CommitUsed(ctx, "r_3", map[string]int64{"requests": 1}); err != nil || r3.Used != 6 || r3.UsedByMetric["tokens"] != 5 {
		t.Errorf("CommitUsed r_3 = %+v, %v", r3, err)
	}
	// A one-metric commit reads numbers, and has no per-metric maps.
	one, err := c.Commit(ctx, "r_2", 4)
	if err != nil || one.Used != 4 || one.Released != 6 || one.UsedByMetric != nil {
		t.Errorf("Commit = %+v, %v", one, err)
	}
}
