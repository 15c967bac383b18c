package httpapi_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exaring/otelpgx"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// statements returns the SQL of every Postgres span in spans (otelpgx's): queries and
// the prepares pgx sends before a statement's first use on a connection.
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

// queries returns the SQL of the Postgres query spans in spans, one per statement
// executed: the prepares (spans with a prepared statement's name) left out.
func queries(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		if !slices.ContainsFunc(s.Attributes, func(kv attribute.KeyValue) bool { return kv.Key == otelpgx.PrepareStmtNameKey }) {
			out = append(out, statements(tracetest.SpanStubs{s})...)
		}
	}
	return out
}

// A cold org is resolved in one query, and its key in another; the checks of further
// users of a warm org (registered or not) make none, since the org carries its
// registered users: not a query per table (key, org, limits, grants, plans, teams,
// users...), nor as many prepares on a connection that has not run them.
func TestColdOrgResolvedInTwoQueries(t *testing.T) {
	r, exp := newTracedReplica(t)
	key, _ := r.setup("acme")
	r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"alice","limits":[{"metric":"requests","window":"month","limit":2}]}`, 201)
	exp.Reset()
	if got := r.check(key, `{"org":"acme","team":"eng","user":"first"}`); got.code != 200 {
		t.Fatalf("first check: %d %s", got.code, got.raw)
	}
	spans := exp.GetSpans()
	qs, all := queries(spans), statements(spans)
	for _, q := range qs {
		q = strings.Join(strings.Fields(q), " ")
		t.Log(q[:min(len(q), 100)])
	}
	t.Logf("the first check of a cold key and org: %d queries (%d statements with prepares)", len(qs), len(all))
	if len(qs) > 2 {
		t.Errorf("a cold key and org took %d queries, want at most 2 (the key, the org)", len(qs))
	}
	var key1, org1 int
	for _, q := range qs {
		switch {
		case strings.Contains(q, "FROM api_keys"):
			key1++
		case strings.Contains(q, "FROM orgs o JOIN plans"):
			org1++
		}
	}
	if key1 != 1 || org1 != 1 {
		t.Errorf("want one key lookup and one org resolution, got %d and %d", key1, org1)
	}
	if len(all) > 2*len(qs) {
		t.Errorf("%d statements for %d queries: more than a prepare each", len(all), len(qs))
	}

	// Further users of the warm org, registered ("alice", from setup) or not: no query.
	exp.Reset()
	const n = 15 // the plan allows 20 a minute
	for i := range n {
		user, want := "new"+string(rune('a'+i)), 200
		if i < 3 {
			user, want = "alice", 200+229*(i/2) // her own month limit is 2: the org carries it
		}
		if got := r.check(key, `{"org":"acme","team":"eng","user":"`+user+`"}`); got.code != want {
			t.Fatalf("check %d (%s): %d %s, want %d", i, user, got.code, got.raw, want)
		}
	}
	if qs := queries(exp.GetSpans()); len(qs) != 0 {
		t.Errorf("%d checks of new users of a warm org made %d queries, want 0: %q", n, len(qs), qs)
	}
}

// The check path writes nothing to Postgres: not even a key's last_used_at (UPDATE
// api_keys) on the request; authentication notes the use and the service writes the
// notes in batches, off the path. The statements of the checks are read from their
// Postgres spans.
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
