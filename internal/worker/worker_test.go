package worker_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/worker"
)

// The queue starts, runs its first job, and stops cleanly; migrations run twice
// without harm.
func TestClientStartsRunsAndStops(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	for range 2 {
		if err := worker.MigrateRiver(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	c, err := worker.NewClient(pool, worker.Config{ID: "test-worker", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	var seen time.Time
	for seen.IsZero() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		if seen, err = worker.LastHeartbeat(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	if seen.IsZero() {
		t.Fatal("no heartbeat job ran within 20s")
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Stop(stopCtx); err != nil {
		t.Fatalf("stop: %v", err)
	}
}
