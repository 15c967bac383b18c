package httpapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// statements returns the SQL of every Postgres span in spans (otelpgx's).
func statements(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		for _, kv := range s.Attributes {
			if k := string(kv.Key); k == "db.query.text" || k == "db.statement" {
				out = append(out, kv.Value.AsString())
			}
		}
	}
	return out
}

// Issue 26: the check path writes nothing to Postgres. A key's first checks used to
// write its last_used_at (UPDATE api_keys) on the request; now authentication notes the
// use and the service writes the notes in batches, off the path. The statements of the
// checks are read from their Postgres spans.
func TestCheckPathWritesNothingToPostgres(t *testing.T) {
	r, exp := newTracedReplica(t)
	key, _ := r.setup("acme")
	exp.Reset()
	for i := range 5 { // the first: a cold key and a cold org
		if got := r.check(key, `{"org":"acme","team":"eng","user":"u`+string(rune('a'+i))+`"}`); got.code != 200 {
			t.Fatalf("check %d: %d %s", i, got.code, got.raw)
		}
	}
	stmts := statements(exp.GetSpans())
	if len(stmts) == 0 {
		t.Fatal("no Postgres statement traced: the cold check must have resolved its key and org")
	}
	for _, s := range stmts {
		switch verb := strings.ToUpper(strings.Fields(strings.TrimSpace(s))[0]); verb {
		case "SELECT", "WITH":
		default:
			t.Errorf("the check path wrote to Postgres: %s", s)
		}
	}
	t.Logf("5 checks (the first of a cold key, org and users): %d Postgres statements, 0 writes", len(stmts))
	for _, s := range stmts {
		s = strings.Join(strings.Fields(s), " ")
		t.Log(s[:min(len(s), 120)])
	}

	// The use is still recorded, in a batch.
	var used *time.Time
	if err := r.f.pool.QueryRow(context.Background(), `SELECT max(last_used_at) FROM api_keys WHERE org_id = 'acme'`).Scan(&used); err != nil {
		t.Fatal(err)
	}
	if used != nil {
		t.Fatalf("last_used_at %v written before the batch", used)
	}
	if err := r.f.svc.FlushKeyUses(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r.f.pool.QueryRow(context.Background(), `SELECT max(last_used_at) FROM api_keys WHERE org_id = 'acme'`).Scan(&used); err != nil {
		t.Fatal(err)
	}
	if used == nil {
		t.Error("the key's use was not recorded by FlushKeyUses")
	}
}
