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

// startDecide starts the span of a batch given to Engines.Decide: "quota.check" for a
// single check, "quota.check_batch" for several.
func startDecide(t trace.Tracer, ctx context.Context, cs []Check) (context.Context, trace.Span) {
	if len(cs) == 1 {
		req := &cs[0].Request
		attrs := []attribute.KeyValue{AttrOrg.String(req.Org), AttrMetric.String(req.Metric), AttrCost.Int64(req.Cost)}
		if req.Team != "" {
			attrs = append(attrs, AttrTeam.String(req.Team))
		}
		return t.Start(ctx, "quota.check", trace.WithAttributes(attrs...))
	}
	attrs := []attribute.KeyValue{AttrBatchSize.Int(len(cs))}
	if len(cs) > 0 {
		org := cs[0].Request.Org
		for i := range cs {
			if cs[i].Request.Org != org {
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

// endDecide records how the checks of cs were answered on their span and ends it. A
// denial is an answer, not an error.
func endDecide(span trace.Span, cs []Check) {
	if len(cs) == 1 {
		endCheck(span, &cs[0])
		return
	}
	allowed, failed := 0, 0
	for i := range cs {
		switch {
		case cs[i].Err != nil:
			failed++
		case cs[i].Result.Allowed:
			allowed++
		}
	}
	span.SetAttributes(AttrBatchAllowed.Int(allowed), AttrBatchErrors.Int(failed))
	span.End()
}

// endCheck records a single check's answer on its span and ends it.
func endCheck(span trace.Span, c *Check) {
	span.SetAttributes(AttrPool.String(c.Outcome.Pool), AttrDegraded.Bool(c.Outcome.Degraded))
	if c.Err != nil {
		span.RecordError(c.Err)
		span.SetStatus(codes.Error, "check not decided")
		span.End()
		return
	}
	res := &c.Result
	span.SetAttributes(AttrAllowed.Bool(res.Allowed))
	if res.Replayed {
		span.SetAttributes(AttrReplayed.Bool(true))
	}
	if b := res.BlockedAt; !res.Allowed && b != nil {
		span.SetAttributes(AttrBlockedLevel.String(string(b.Level)), AttrBlockedWin.String(string(b.Window)))
	}
	span.End()
}

// startPipeline starts the span of one pipeline of calls, sent from ctx: a child of
// ctx's span when it has one (a batch's own pipeline), linked to the span of every
// call from another trace (the coalesced checks of the batching loop). It returns nil when no call (and not
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
