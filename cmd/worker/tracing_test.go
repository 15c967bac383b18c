package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/platform/tracing/tracingtest"
)

// With OTEL_EXPORTER_OTLP_ENDPOINT set, the real worker exports a span per flush
// (its Postgres queries in its trace) and per job (the heartbeat, through otelriver),
// as quotaplane-worker, flushed at shutdown: the batch exporter waits ten minutes.
func TestSpansExportedOverOTLPAndFlushedAtShutdown(t *testing.T) {
	recv := tracingtest.NewReceiver(t)
	dbURL := testenv.PostgresURL(t)
	cmd, stderr, done := startMain(t, map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": testenv.RedisURL(t),
		"QUOTA_WORKER_HTTP_ADDR": freeAddr(t), "QUOTA_FLUSH_INTERVAL": "100ms",
		"OTEL_EXPORTER_OTLP_ENDPOINT": recv.URL, "OTEL_BSP_SCHEDULE_DELAY": "600000"})
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	deadline := time.After(60 * time.Second)
	for { // the heartbeat job runs on start
		var n int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM worker_heartbeats").Scan(&n); err == nil && n > 0 {
			break
		}
		select {
		case <-done:
			t.Fatalf("the worker stopped (%v); stderr:\n%s", cmd.ProcessState, stderr)
		case <-deadline:
			t.Fatalf("no heartbeat within 60s; stderr:\n%s", stderr)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if n := len(recv.Spans()); n != 0 {
		t.Fatalf("%d spans exported before shutdown with a 10 minute batch delay", n)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the worker did not stop within 60s of SIGTERM; stderr:\n%s", stderr)
	}
	flushes := recv.Named("billing.flush")
	if len(flushes) == 0 {
		t.Fatalf("no billing.flush span among %d; stderr:\n%s", len(recv.Spans()), stderr)
	}
	if flushes[0].Service != "quotaplane-worker" {
		t.Errorf("service %q, want quotaplane-worker", flushes[0].Service)
	}
	inFlush := 0
	for _, s := range recv.Spans() {
		if s.TraceID == flushes[0].TraceID && s.Attrs["db.system.name"] == "postgresql" {
			inFlush++
		}
	}
	if inFlush == 0 {
		t.Errorf("no Postgres span in a flush's trace")
	}
	if len(recv.Named("river.work/worker.heartbeat")) == 0 {
		var names []string
		for _, s := range recv.Spans() {
			names = append(names, s.Name)
		}
		t.Errorf("no span of the heartbeat job: %s", strings.Join(names, ", "))
	}
	testenv.AssertJSONLines(t, stderr.String())
}
