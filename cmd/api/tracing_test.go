package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/platform/tracing/tracingtest"
)

// With OTEL_EXPORTER_OTLP_ENDPOINT set, the real api process exports its spans over
// OTLP: an admin call's server span and its Postgres spans, as quotaplane-api. The
// batch exporter is told to wait ten minutes, so the spans arrive only because
// SIGTERM's shutdown flushes them.
func TestSpansExportedOverOTLPAndFlushedAtShutdown(t *testing.T) {
	recv := tracingtest.NewReceiver(t)
	addr := freeAddr(t)
	const token = "a-test-operator-token"
	cmd, stderr := startMain(t, map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"QUOTA_HTTP_ADDR": addr, "QUOTA_GRPC_ADDR": "127.0.0.1:0", "QUOTA_ADMIN_TOKEN": token,
		"OTEL_EXPORTER_OTLP_ENDPOINT": recv.URL, "OTEL_BSP_SCHEDULE_DELAY": "600000"})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("api not ready: %v; stderr:\n%s", err, stderr)
		}
		time.Sleep(100 * time.Millisecond)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/plans", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET /v1/plans = %d", resp.StatusCode)
	}
	if n := len(recv.Spans()); n != 0 {
		t.Fatalf("%d spans exported before shutdown with a 10 minute batch delay", n)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()

	calls := recv.Named("GET /v1/plans")
	if len(calls) != 1 {
		t.Fatalf("%d spans of GET /v1/plans among %d exported; stderr:\n%s", len(calls), len(recv.Spans()), stderr)
	}
	call := calls[0]
	if call.Service != "quotaplane-api" || call.Attrs["http.route"] != "/v1/plans" {
		t.Errorf("server span: service %q, attributes %v", call.Service, call.Attrs)
	}
	queries := 0
	for _, s := range recv.Spans() {
		if s.TraceID == call.TraceID && s.Attrs["db.system.name"] == "postgresql" {
			queries++
		}
		for k, v := range s.Attrs {
			if strings.Contains(v, token) {
				t.Errorf("span %q: %s carries the operator token", s.Name, k)
			}
		}
	}
	if queries == 0 {
		t.Errorf("no Postgres span in the admin call's trace; spans: %v", recv.Spans())
	}
	if !strings.Contains(stderr.String(), "tracing: exporting spans over OTLP") {
		t.Errorf("start-up does not say traces are exported:\n%s", stderr)
	}
	testenv.AssertJSONLines(t, stderr.String())
}
