package tracing_test

import (
	"context"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/tracing"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestEnabled(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want bool
	}{
		{"nothing set", nil, false},
		{"endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{"traces endpoint", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{"sdk disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "TRUE"}, false},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, false},
		{"only a sampler", map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tracing.Enabled(env(tc.env)); got != tc.want {
				t.Errorf("Enabled = %v, want %v", got, tc.want)
			}
		})
	}
}

// Off, Setup returns no provider (so nothing is wrapped or traced) and a shutdown
// that does nothing.
func TestSetupOff(t *testing.T) {
	tp, stop, err := tracing.Setup(context.Background(), tracing.APIService, env(nil))
	if err != nil || tp != nil {
		t.Fatalf("Setup without an endpoint = %v, %v; want nil, nil", tp, err)
	}
	if err := stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// An unknown protocol stops the binary at start, naming the variable.
func TestSetupRefusesUnknownProtocol(t *testing.T) {
	_, _, err := tracing.Setup(context.Background(), tracing.APIService, env(map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}))
	if err == nil || !strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Fatalf("err = %v", err)
	}
}

// Both OTLP protocols build an exporter without contacting the collector (a down
// collector must not stop the binary), and the shutdown stops it.
func TestSetupBothProtocols(t *testing.T) {
	for _, proto := range []string{"", "http/protobuf", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			tp, stop, err := tracing.Setup(context.Background(), tracing.WorkerService, env(map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": proto}))
			if err != nil || tp == nil {
				t.Fatalf("Setup = %v, %v", tp, err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // nothing to flush: stopping must not wait for the absent collector
			_ = stop(ctx)
		})
	}
}
