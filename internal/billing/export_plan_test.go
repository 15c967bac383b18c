package billing_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// firstByte is a writer that notes when its first byte came.
type firstByte struct {
	mu    sync.Mutex
	start time.Time
	first time.Duration
	n     int
}

func (w *firstByte) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 && len(p) > 0 {
		w.first = time.Since(w.start)
	}
	w.n += bytes.Count(p, []byte("\n"))
	return len(p), nil
}

// The export over 1,000 orgs (100 users in 5 teams each) on a database that was
// never analysed and whose autovacuum is off answers its first byte within a second:
// without statistics, a planner free to nest the team rows against a per-team
// aggregate of the user rows would answer only after all of it.
func TestExportWithoutStatisticsStreamsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("large export")
	}
	e := newEnv(t)
	ctx := context.Background()
	period := e.Engine.Period(1).ID
	prefix := testenv.ID(t, "x")
	tables := []string{"orgs", "plans", "plan_prices", "usage_counters", "usage_adjustments", "period_usage",
		"billing_periods", "billing_lines", "grants"}
	for _, tb := range tables {
		if _, err := e.Pool.Exec(ctx, `ALTER TABLE `+tb+` SET (autovacuum_enabled = off)`); err != nil {
			t.Fatal(err)
		}
	}
	for _, q := range []string{
		`INSERT INTO plans (id, name, fail_mode, currency, base_price) VALUES ($1 || '-plan', 'P', 'open', 'EUR', 10)`,
		`INSERT INTO plan_prices (plan_id, metric, included_units, overage_price) VALUES ($1 || '-plan', 'requests', 1000, 0.01)`,
		`INSERT INTO orgs (id, name, plan_id) SELECT $1 || '-' || lpad(o::text, 4, '0'), 'O', $1 || '-plan' FROM generate_series(1, 1000) o`,
		`INSERT INTO usage_counters (org_id, period, metric, level, team_id, user_id, units)
		 SELECT $1 || '-' || lpad(o::text, 4, '0'), $2, 'requests', 'user', 'team-' || (u % 5), 'user-' || u, u
		 FROM generate_series(1, 1000) o, generate_series(1, 100) u`,
		`INSERT INTO usage_counters (org_id, period, metric, level, team_id, user_id, units)
		 SELECT org_id, period, metric, 'team', team_id, '', sum(units) + 7 FROM usage_counters
		 WHERE period = $2 AND level = 'user' AND org_id LIKE $1 || '-%' GROUP BY 1, 2, 3, 5`,
		`INSERT INTO usage_counters (org_id, period, metric, level, team_id, user_id, units)
		 SELECT org_id, period, metric, 'org', '', '', sum(units) FROM usage_counters
		 WHERE period = $2 AND level = 'team' AND org_id LIKE $1 || '-%' GROUP BY 1, 2, 3`,
	} {
		args := []any{prefix}
		if strings.Contains(q, "$2") {
			args = append(args, period)
		}
		if _, err := e.Pool.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	var analysed int
	if err := e.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_user_tables
		WHERE relname = ANY($1) AND (last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL)`, tables).Scan(&analysed); err != nil {
		t.Fatal(err)
	}
	if analysed != 0 {
		t.Fatalf("%d tables were analysed", analysed)
	}
	w := &firstByte{start: time.Now()}
	if err := e.store.WriteExport(ctx, w, "", period, billing.CSV); err != nil {
		t.Fatal(err)
	}
	took := time.Since(w.start)
	// 1,000 orgs x (100 users + 5 team remainders + 1 total) and the header.
	if w.n != 1000*106+1 {
		t.Fatalf("%d lines, want %d", w.n, 1000*106+1)
	}
	t.Logf("export of 1,000 orgs, 106,000 rows, never analysed: first byte after %s, all in %s", w.first.Round(time.Millisecond), took.Round(time.Millisecond))
	if w.first > time.Second {
		t.Errorf("first byte after %s, want < 1 s", w.first)
	}
}
