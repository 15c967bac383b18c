package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/ledger/ledgertest"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// An idle worker exports no trace every flush interval. The first flush is traced,
// idle ones after it are not (nor their queries, which would start traces of their
// own), and a flush that finds work is recorded again.
func TestIdleFlushesAreNotTraced(t *testing.T) {
	e := newEnv(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg, err := pgdb.ParseConfig(e.DBURL)
	if err != nil {
		t.Fatal(err)
	}
	pgdb.Trace(cfg, tp) // the flush's queries make spans, as in the worker
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil)
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: ledger.NewStore(pool), Tenants: tenants.NewService(pool),
		Counters: oneEngine(e.Engine), Interval: 20 * time.Millisecond, Logger: quietLog(), TracerProvider: tp})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	flushes := func() (n, withWork int) {
		for _, s := range exp.GetSpans() {
			if s.Name != "billing.flush" {
				continue
			}
			n++
			for _, kv := range s.Attributes {
				if kv.Key == "quotaplane.flush.read" && kv.Value.AsInt64() > 0 {
					withWork++
				}
			}
		}
		return n, withWork
	}
	time.Sleep(600 * time.Millisecond) // about 30 idle flushes, the first one reading everything
	n, _ := flushes()
	all := len(exp.GetSpans())
	time.Sleep(400 * time.Millisecond)
	if n2, _ := flushes(); n2 != n || n > 2 {
		t.Errorf("billing.flush spans: %d after 0.6 s, %d after 1 s of idle flushes every 20 ms; want at most 2, then none", n, n2)
	}
	if now := len(exp.GetSpans()); now != all {
		t.Errorf("%d spans exported by 0.4 s of idle flushes (their queries)", now-all)
	}

	if _, err := e.Check(e.Engine, org, "", "", "requests", 3); err != nil {
		t.Fatal(err)
	}
	ledgertest.WaitFor(t, 5*time.Second, "a traced flush with work", func() bool { _, w := flushes(); return w > 0 })
}
