// Package tracingtest is an in-process OTLP/HTTP trace collector for tests of the
// binaries' real processes: point OTEL_EXPORTER_OTLP_ENDPOINT at Receiver.URL and
// read back the spans they exported.
package tracingtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is what the receiver keeps of an exported span.
type Span struct {
	Service string // the resource's service.name
	Name    string
	TraceID string            // raw bytes, for comparing
	Attrs   map[string]string // values as text
}

// Receiver decodes every export request posted to /v1/traces and keeps its spans.
type Receiver struct {
	URL   string // what OTEL_EXPORTER_OTLP_ENDPOINT should be
	mu    sync.Mutex
	spans []Span
}

// NewReceiver starts a receiver on loopback, stopped when the test ends.
func NewReceiver(tb testing.TB) *Receiver {
	tb.Helper()
	r := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	tb.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (o *Receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltracepb.ExportTraceServiceRequest
	if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(body, &req) != nil {
		http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		service := attrs(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				o.spans = append(o.spans, Span{Service: service, Name: s.Name, TraceID: string(s.TraceId), Attrs: attrs(s.Attributes)})
			}
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Spans returns the spans received so far.
func (o *Receiver) Spans() []Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]Span(nil), o.spans...)
}

// Named returns the spans received so far called name.
func (o *Receiver) Named(name string) []Span {
	var out []Span
	for _, s := range o.Spans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attrs(list []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range list {
		v := kv.GetValue()
		if s, ok := v.GetValue().(*commonpb.AnyValue_StringValue); ok {
			m[kv.Key] = s.StringValue
			continue
		}
		m[kv.Key] = strings.TrimSpace(v.String())
	}
	return m
}
