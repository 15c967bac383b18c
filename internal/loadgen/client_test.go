package loadgen

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestAdminWaitsOutRateLimit: provisioning through an api whose admin rate limit
// (QUOTA_ADMIN_RATE_LIMIT) refuses some requests waits for Retry-After and goes on,
// while a check's 429 stays a decision.
func TestAdminWaitsOutRateLimit(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 2 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"p"}`))
	}))
	defer srv.Close()
	c := newClient(srv.URL, 1)
	var out struct{ ID string }
	code, err := c.admin(context.Background(), "POST", "/v1/plans", "tok", map[string]string{}, &out)
	if code != http.StatusOK || err != nil || out.ID != "p" || calls.Load() != 3 {
		t.Fatalf("admin = %d, %v, %+v after %d calls; want 200 on the third", code, err, out, calls.Load())
	}
	calls.Store(0)
	if code, _ := c.do(context.Background(), "POST", "/v1/check", "tok", map[string]string{}, nil); code != http.StatusTooManyRequests || calls.Load() != 1 {
		t.Fatalf("check = %d after %d calls; want the 429 answered once", code, calls.Load())
	}
}
