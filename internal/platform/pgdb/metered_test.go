package pgdb_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/migrations"
)

// Migration 000007 declares as metered the metrics that existing allocations name and
// their plan does not (in limits or pricing), so they stay checkable; nothing else.
func TestPlanMeteredMigrationKeepsAllocationsValid(t *testing.T) {
	ctx := context.Background()
	c, err := pgx.Connect(ctx, testenv.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	run := func(name string) {
		t.Helper()
		sql, err := migrations.FS.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, string(sql)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	run("000007_plan_metered.down.sql")
	if _, err := c.Exec(ctx, `
		INSERT INTO plans (id, name, fail_mode) VALUES ('pro', 'Pro', 'open'), ('free', 'Free', 'open'), ('bare', 'Bare', 'open');
		INSERT INTO plan_limits VALUES ('pro', 'requests', 'month', 1000);
		INSERT INTO plans (id, name, fail_mode, currency, base_price) VALUES ('priced', 'Priced', 'open', 'EUR', 1);
		INSERT INTO plan_prices VALUES ('priced', 'images', 0, 1);
		INSERT INTO orgs (id, name, plan_id) VALUES ('a', 'A', 'pro'), ('b', 'B', 'pro'), ('c', 'C', 'free'), ('d', 'D', 'priced');
		INSERT INTO teams (org_id, id, name) VALUES ('a', 'eng', 'Eng'), ('b', 'ml', 'ML'), ('d', 'art', 'Art');
		INSERT INTO team_limits VALUES ('a', 'eng', 'team', 'requests', 'month', 10), ('a', 'eng', 'user_default', 'tokens', 'day', 5),
			('d', 'art', 'team', 'images', 'day', 5);
		INSERT INTO users (org_id, team_id, id) VALUES ('b', 'ml', 'zoe');
		INSERT INTO user_limits VALUES ('b', 'zoe', 'gpu_seconds', 'hour', 60), ('b', 'zoe', 'tokens', 'hour', 60);
	`); err != nil {
		t.Fatal(err)
	}
	run("000007_plan_metered.up.sql")
	got := map[string][]string{}
	rows, _ := c.Query(ctx, `SELECT id, metered FROM plans`)
	var id string
	var metered []string
	if _, err := pgx.ForEachRow(rows, []any{&id, &metered}, func() error { got[id] = metered; return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"pro": {"gpu_seconds", "tokens"}, "free": {}, "bare": {}, "priced": {}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("metered after the migration (-want +got):\n%s", diff)
	}
}
