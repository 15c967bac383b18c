package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
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

// River's producer logs its job counts every few seconds while jobs run: routine
// chatter that must not fill an info-level log.
func TestRiverRoutineChatterIsDebug(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t)
	if err := worker.MigrateRiver(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var out testenv.Buffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := worker.NewClient(pool, worker.Config{ID: "test-chatter", HeartbeatEvery: 200 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = c.Stop(stopCtx)
	}()
	var counts map[string]any
	for deadline := time.Now().Add(30 * time.Second); counts == nil && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond)
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("not a JSON line: %q", line)
			}
			if strings.HasSuffix(fmt.Sprint(rec["msg"]), "Producer job counts") {
				counts = rec
			}
		}
	}
	if counts == nil {
		t.Fatalf("River logged no job counts within 30s:\n%s", out.String())
	}
	if counts["level"] != "DEBUG" {
		t.Errorf("job counts logged at %v, want DEBUG: %v", counts["level"], counts)
	}
}
