// Package tracing sets up OpenTelemetry tracing for both binaries from the standard
// OTEL_* environment variables. Tracing is on only when an OTLP endpoint is named
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); otherwise
// Setup returns a nil provider and every instrumented path skips its spans, so a
// check costs nothing more than without tracing (see docs/TRACING.md).
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaplane/quotaplane/internal/platform/redact"
)

// Service names of the two binaries (OTEL_SERVICE_NAME overrides them).
const (
	APIService    = "quotaplane-api"
	WorkerService = "quotaplane-worker"
)

// Enabled reports whether the environment asks for traces: an OTLP endpoint is set
// and OTEL_SDK_DISABLED is not "true".
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup returns the tracer provider of service and the function that flushes and
// stops it, exporting over OTLP as the OTEL_* variables say: the protocol
// (OTEL_EXPORTER_OTLP_PROTOCOL or its TRACES_ form: http/protobuf, the default, or
// grpc), endpoint, headers, timeout, compression and certificates are read by the
// exporter; the sampler (OTEL_TRACES_SAMPLER, default parentbased_always_on) and the
// batch processor's OTEL_BSP_* by the SDK; OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES by the resource. It also installs the provider and the
// W3C trace-context propagator globally, for libraries that look there.
//
// When tracing is not Enabled it returns a nil provider and a shutdown that does
// nothing: callers pass the nil on, and instrumented code starts no spans at all.
func Setup(ctx context.Context, service string, getenv func(string) string) (trace.TracerProvider, func(context.Context) error, error) {
	none := func(context.Context) error { return nil }
	if !Enabled(getenv) {
		return nil, none, nil
	}
	exp, err := newExporter(ctx, getenv)
	if err != nil {
		return nil, none, err
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, none, fmt.Errorf("tracing: resource: %w", err)
	}
	// The environment's service name and attributes win over the binary's.
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	return tp, tp.Shutdown, nil
}

func newExporter(ctx context.Context, getenv func(string) string) (sdktrace.SpanExporter, error) {
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "", "http/protobuf":
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP over HTTP: %w", err)
		}
		return exp, nil
	case "grpc":
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("tracing: OTLP over gRPC: %w", err)
		}
		return exp, nil
	default:
		return nil, fmt.Errorf("tracing: OTEL_EXPORTER_OTLP_PROTOCOL %q is not supported: use http/protobuf or grpc", proto)
	}
}

// Endpoint is the OTLP endpoint traces go to, for the start-up log line: the
// traces-specific variable when set, else the general one.
func Endpoint(getenv func(string) string) string {
	if e := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"); e != "" {
		return e
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
}

// Start is Setup for a binary's run: it logs where spans go when tracing is on, and
// its stop flushes the last spans within 5 s, logging a failure. Defer stop first, so
// it runs once everything that makes spans has stopped.
func Start(ctx context.Context, service string, getenv func(string) string, log *slog.Logger) (trace.TracerProvider, func(), error) {
	tp, shutdown, err := Setup(ctx, service, getenv)
	if err != nil {
		return nil, nil, err
	}
	if tp != nil {
		log.Info("tracing: exporting spans over OTLP", "endpoint", redact.URL(Endpoint(getenv)))
	}
	return tp, func() {
		flushCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(flushCtx); err != nil {
			log.Warn("could not flush the last spans", "err", err.Error())
		}
	}, nil
}
