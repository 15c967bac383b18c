package quota

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Tracing (Config.TracerProvider). Every span below is started only when the engine or
// router has a tracer, so with tracing off a check pays one nil comparison per step.
//
// A check's span, "quota.check", is started by the Engines and carries what was asked
// and answered (org, team, metric, cost; allowed, pool, degraded), never a user id
// or an idempotency key. Checks are coalesced: one pipeline carries checks of many
// requests, so its span, "redis.pipeline", belongs to none of their traces. It is a
// root span linked to the span of every sampled check it carries, and each of those
// spans gets a link back to it: from a check's trace, a viewer jumps to the pipeline
// that decided it and sees how many other checks shared the round trip.

// TracerName is the instrumentation scope of the engine's and router's spans.
const TracerName = "github.com/quotaplane/quotaplane/internal/quota"

// Span attribute keys of checks and pipelines.
const (
	AttrOrg          = attribute.Key("quotaplane.org")
	AttrTeam         = attribute.Key("quotaplane.team")
	AttrMetric       = attribute.Key("quotaplane.metric")
	AttrCost         = attribute.Key("quotaplane.cost")
	AttrAllowed      = attribute.Key("quotaplane.allowed")
	AttrPool         = attribute.Key("quotaplane.pool")
	AttrDegraded     = attribute.Key("quotaplane.degraded")
	AttrReplayed     = attribute.Key("quotaplane.replayed")
	AttrBlockedLevel = attribute.Key("quotaplane.blocked.level")
	AttrBlockedWin   = attribute.Key("quotaplane.blocked.window")
	AttrBatchSize    = attribute.Key("quotaplane.batch.size")
	AttrBatchAllowed = attribute.Key("quotaplane.batch.allowed")
	AttrBatchErrors  = attribute.Key("quotaplane.batch.errors")
	AttrPipeSize     = attribute.Key("db.operation.batch.size")
	AttrPipeFailed   = attribute.Key("quotaplane.pipeline.failed")
	AttrPipeResent   = attribute.Key("quotaplane.pipeline.noscript_resent")
)

func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer(TracerName)
}

// startCheck starts the span of one check of req.
func startCheck(t trace.Tracer, ctx context.Context, req *Request) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{AttrOrg.String(req.Org), AttrMetric.String(req.Metric), AttrCost.Int64(req.Cost)}
	if req.Team != "" {
		attrs = append(attrs, AttrTeam.String(req.Team))
	}
	return t.Start(ctx, "quota.check", trace.WithAttributes(attrs...))
}

// endCheck records a check's answer on its span and ends it. A denial is an answer,
// not an error.
func endCheck(span trace.Span, res *Result, out Outcome, err error) {
	span.SetAttributes(AttrPool.String(out.Pool), AttrDegraded.Bool(out.Degraded))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "check not decided")
		span.End()
		return
	}
	span.SetAttributes(AttrAllowed.Bool(res.Allowed))
	if res.Replayed {
		span.SetAttributes(AttrReplayed.Bool(true))
	}
	if b := res.BlockedAt; !res.Allowed && b != nil {
		span.SetAttributes(AttrBlockedLevel.String(string(b.Level)), AttrBlockedWin.String(string(b.Window)))
	}
	span.End()
}

// startBatch starts the span of a batch of checks.
func startBatch(t trace.Tracer, ctx context.Context, reqs []Request) (context.Context, trace.Span) {
	attrs := []attribute.KeyValue{AttrBatchSize.Int(len(reqs))}
	if len(reqs) > 0 {
		org := reqs[0].Org
		for i := range reqs {
			if reqs[i].Org != org {
				org = ""
				break
			}
		}
		if org != "" {
			attrs = append(attrs, AttrOrg.String(org))
		}
	}
	return t.Start(ctx, "quota.check_batch", trace.WithAttributes(attrs...))
}

// endBatch records how a batch was answered on its span and ends it.
func endBatch(span trace.Span, results []Result, errs []error) {
	allowed, failed := 0, 0
	for i := range results {
		switch {
		case errs[i] != nil:
			failed++
		case results[i].Allowed:
			allowed++
		}
	}
	span.SetAttributes(AttrBatchAllowed.Int(allowed), AttrBatchErrors.Int(failed))
	span.End()
}

// startPipeline starts the span of one pipeline of calls, sent from ctx: a child of
// ctx's span when it has one (CheckBatch), linked to the span of every call from
// another trace (the coalesced checks of Check). It returns nil when no call (and not
// ctx) is sampled: a pipeline nobody traces is not traced.
func (e *Engine) startPipeline(ctx context.Context, calls []*call, n int) trace.Span {
	parent := trace.SpanContextFromContext(ctx)
	var links []trace.Link
	for _, c := range calls {
		if c.err != nil {
			continue // not sent
		}
		sc := trace.SpanContextFromContext(c.ctx)
		if !sc.IsSampled() || sc.Equal(parent) || len(links) > 0 && sc.Equal(links[len(links)-1].SpanContext) {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
	}
	if len(links) == 0 && !parent.IsSampled() {
		return nil
	}
	_, span := e.tracer.Start(ctx, "redis.pipeline", trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("db.system.name", "redis"), attribute.String("db.operation.name", "EVALSHA"),
			AttrPipeSize.Int(n)))
	return span
}

// endPipeline ends a pipeline's span, counting the commands that failed, and links
// each carried check's span back to it.
func (e *Engine) endPipeline(ctx context.Context, span trace.Span, calls []*call, resent int) {
	parent := trace.SpanContextFromContext(ctx)
	failed := 0
	link := trace.Link{SpanContext: span.SpanContext()}
	var last trace.SpanContext
	for _, c := range calls {
		if c.err != nil {
			failed++
		}
		s := trace.SpanFromContext(c.ctx)
		if sc := s.SpanContext(); s.IsRecording() && !sc.Equal(parent) && !sc.Equal(last) {
			s.AddLink(link)
			last = sc
		}
	}
	span.SetAttributes(AttrPipeFailed.Int(failed), AttrPipeResent.Int(resent))
	if failed > 0 {
		span.SetStatus(codes.Error, "commands failed")
	}
	span.End()
}

// traceEvent adds an event to the check's span in ctx, if tracing is on.
func (e *Engine) traceEvent(ctx context.Context, name string) {
	if e.tracer != nil {
		trace.SpanFromContext(ctx).AddEvent(name)
	}
}
