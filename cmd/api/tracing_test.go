package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// otlpSpan is what the receiver keeps of an exported span.
type otlpSpan struct {
	service, name string
	traceID       string
	attrs         map[string]string
}

// otlpReceiver is an in-process OTLP/HTTP trace collector: it decodes every export
// request posted to /v1/traces and keeps its spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		service := kvs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				o.spans = append(o.spans, otlpSpan{service: service, name: s.Name, traceID: string(s.TraceId), attrs: kvs(s.Attributes)})
			}
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (o *otlpReceiver) received() []otlpSpan {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]otlpSpan(nil), o.spans...)
}

func kvs(list []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range list {
		v := kv.GetValue()
		switch {
		case v.GetStringValue() != "":
			m[kv.Key] = v.GetStringValue()
		default:
			m[kv.Key] = strings.TrimSpace(strings.Trim(v.String(), "{}"))
		}
	}
	return m
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, the real api process exports its spans over
// OTLP: an admin call's server span and its Postgres spans, as quotaplane-api. The
// batch exporter is told to wait ten minutes, so the spans arrive only because
// SIGTERM's shutdown flushes them.
func TestSpansExportedOverOTLPAndFlushedAtShutdown(t *testing.T) {
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	addr := freeAddr(t)
	const token = "a-test-operator-token"
	cmd, stderr := startMain(t, map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"QUOTA_HTTP_ADDR": addr, "QUOTA_ADMIN_TOKEN": token,
		"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_BSP_SCHEDULE_DELAY": "600000"})
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
	if n := len(recv.received()); n != 0 {
		t.Fatalf("%d spans exported before shutdown with a 10 minute batch delay", n)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()

	spans := recv.received()
	var call *otlpSpan
	for i, s := range spans {
		if s.name == "GET /v1/plans" {
			call = &spans[i]
		}
	}
	if call == nil {
		t.Fatalf("no span of GET /v1/plans among %d exported; stderr:\n%s", len(spans), stderr)
	}
	if call.service != "quotaplane-api" || call.attrs["http.route"] != "/v1/plans" {
		t.Errorf("server span: service %q, attributes %v", call.service, call.attrs)
	}
	queries := 0
	for _, s := range spans {
		if s.traceID == call.traceID && s.attrs["db.system.name"] == "postgresql" {
			queries++
		}
		for k, v := range s.attrs {
			if strings.Contains(v, token) {
				t.Errorf("span %q: %s carries the operator token", s.name, k)
			}
		}
	}
	if queries == 0 {
		t.Errorf("no Postgres span in the admin call's trace; spans: %v", spans)
	}
	if !strings.Contains(stderr.String(), "tracing: exporting spans over OTLP") {
		t.Errorf("start-up does not say traces are exported:\n%s", stderr)
	}
	assertJSONLines(t, stderr.String())
}
