// Package quotaplanetest tests services that use the Quotaplane client without a
// Quotaplane (as stripe-go's mock server and unkey's NoopRatelimit do):
//
//   - Noop is a middleware.Quota that allows every check and holds every reservation,
//     counting nothing: a handler under the middleware runs as in production;
//   - Server is a fake Quotaplane API on a local httptest server, speaking the real
//     client's protocol: the test scripts its decisions (Decide: allow, deny, a
//     problem, a 503 with Retry-After, a hang), and reads back the requests it got
//     and the reservations it holds.
//
// Neither decides as Quotaplane does (no windows, no levels beyond the one the
// verdict names); the client's behaviour against the real API is tested in the
// repository's internal/clienttest.
package quotaplanetest

import (
	"context"
	"time"

	"github.com/quotaplane/quotaplane/client"
)

// Noop allows every check and holds every reservation ("noop" is its id), counting
// nothing; commits, releases and extends succeed. Its zero value is ready to use,
// and it implements middleware.Quota.
type Noop struct{}

// Check allows req.
func (Noop) Check(_ context.Context, req client.CheckRequest) (*client.CheckResult, error) {
	return &client.CheckResult{Allowed: true, Mode: "enforce", IdempotencyKey: req.IdempotencyKey}, nil
}

// Reserve holds req, as reservation "noop".
func (Noop) Reserve(_ context.Context, req client.ReserveRequest) (*client.Reservation, error) {
	ttl := req.TTL
	if ttl == 0 {
		ttl = time.Minute
	}
	return &client.Reservation{ID: "noop", State: client.StateHeld, Org: req.Org, Team: req.Team, User: req.User,
		Metric: req.Metric, Amount: req.Amount, Amounts: req.Amounts, ExpiresAt: time.Now().Add(ttl), Allowed: true,
		IdempotencyKey: req.IdempotencyKey}, nil
}

// Commit answers reservation id committed with used.
func (Noop) Commit(_ context.Context, id string, used int64) (*client.Reservation, error) {
	return &client.Reservation{ID: id, State: client.StateCommitted, Used: used, Allowed: true, SettledAt: time.Now()}, nil
}

// CommitUsed answers reservation id committed with used.
func (Noop) CommitUsed(_ context.Context, id string, used map[string]int64) (*client.Reservation, error) {
	var sum int64
	for _, n := range used {
		sum += n
	}
	return &client.Reservation{ID: id, State: client.StateCommitted, Used: sum, UsedByMetric: used, Allowed: true, SettledAt: time.Now()}, nil
}

// Release answers reservation id released.
func (Noop) Release(_ context.Context, id string) (*client.Reservation, error) {
	return &client.Reservation{ID: id, State: client.StateReleased, Allowed: true, SettledAt: time.Now()}, nil
}

// Extend answers reservation id held for ttl more.
func (Noop) Extend(_ context.Context, id string, ttl time.Duration) (*client.Reservation, error) {
	return &client.Reservation{ID: id, State: client.StateHeld, ExpiresAt: time.Now().Add(ttl), Allowed: true}, nil
}
