package billing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/internal/worker"
)

// startWorker starts a River client of the real worker wiring with billing jobs whose
// clock is injected.
func (e *env) startWorker(id string, clock func() time.Time, hook *worker.WebhookWorker) (*river.Client[pgx.Tx], *billing.Closer) {
	e.T.Helper()
	closer := billing.NewCloser(billing.CloserConfig{Store: e.store, Tenants: e.Svc,
		Counters: oneEngine(e.Engine), Clock: clock, Grace: time.Minute, WorkerID: id, Logger: quietLog()})
	if hook == nil {
		hook = &worker.WebhookWorker{Deliverer: &webhooks.Deliverer{Store: webhooks.NewStore(e.Pool), Tenants: e.Svc, Secret: []byte("test-secret")}}
	}
	return e.StartWorker(id, closer, hook), closer
}

func (e *env) migrateRiver() { e.MigrateRiver() }

// snapshot reads every row of the billing tables, in order, as text.
func (e *env) snapshot() map[string][]string {
	e.T.Helper()
	out := map[string][]string{}
	for _, q := range []string{
		`SELECT org_id, period, period_start, period_end, plan_id, currency, closed_at, closed_by FROM billing_periods ORDER BY 1, 2`,
		`SELECT org_id, period, metric, level, team_id, user_id, units, month_limit FROM period_usage ORDER BY 1, 2, 3, 4, 5, 6`,
		`SELECT org_id, period, metric, units, included_units, overage_units, priced, overage_price, amount, currency FROM billing_lines ORDER BY 1, 2, 3`,
		`SELECT id, org_id, type, period, dedup_key, payload FROM billing_events ORDER BY id`,
		`SELECT org_id, period, metric, level, team_id, user_id, units FROM usage_counters ORDER BY 1, 2, 3, 4, 5, 6`,
		`SELECT id, org_id, period, metric, units FROM usage_adjustments ORDER BY id`,
	} {
		rows, err := e.Pool.Query(context.Background(), q)
		if err != nil {
			e.T.Fatal(err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				e.T.Fatal(err)
			}
			out[q] = append(out[q], fmt.Sprint(vals...))
		}
		rows.Close()
	}
	return out
}

func (e *env) count(q string, args ...any) int {
	e.T.Helper()
	var n int
	if err := e.Pool.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		e.T.Fatalf("%s: %v", q, err)
	}
	return n
}

// The second "Done when": with an injected clock past the month boundary, every org's
// period is closed exactly once although two workers run the scan and the close jobs
// and also close directly at the same time; a second run changes no row; the billing
// rows match the usage and the plan's pricing; and a late flush after the close is
// reconciled as an adjustment.
func TestMonthBoundaryClosesEveryOrgOnceWithTwoWorkers(t *testing.T) {
	e := newEnv(t)
	e.migrateRiver()
	ctx := context.Background()
	const nOrgs = 6
	pricing := &tenants.Pricing{Currency: "EUR", BasePrice: "10", Metrics: []tenants.MetricPrice{
		{Metric: "requests", IncludedUnits: 100, OveragePrice: "0.015"},
		{Metric: "tokens", IncludedUnits: 1000, OveragePrice: "0.0001"},
	}}
	var orgs []string
	admitted := map[string]int64{} // org -> requests units admitted
	for i := range nOrgs {
		org := testenv.ID(t, fmt.Sprintf("org%d", i))
		orgs = append(orgs, org)
		var p *tenants.Pricing
		if i%2 == 0 {
			p = pricing
		}
		e.Seed(org, []vocab.Limit{monthLimit("requests", 10_000)}, p,
			tenants.TeamInput{ID: "eng", UserLimits: []vocab.Limit{monthLimit("requests", 1000)}})
		for j := range 5 + 10*i {
			cost := int64(1 + j%7)
			res, err := e.Check(e.Engine, org, "eng", fmt.Sprintf("u%d", j%3), "requests", cost)
			if err != nil {
				t.Fatal(err)
			}
			if res.Allowed {
				admitted[org] += cost
			}
		}
	}
	if _, err := e.Flusher(time.Hour).FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// Some usage only in Redis (not flushed): the close must take it.
	if _, err := e.Check(e.Engine, orgs[0], "eng", "u0", "requests", 50); err != nil {
		t.Fatal(err)
	}
	admitted[orgs[0]] += 50

	per := e.Engine.Period(1)
	clock := func() time.Time { return per.End.Add(2 * time.Minute) } // the injected clock
	c1, closer1 := e.startWorker("worker-1", clock, nil)
	c2, closer2 := e.startWorker("worker-2", clock, nil)

	// Before the grace has passed nothing is due.
	early := billing.NewCloser(billing.CloserConfig{Store: e.store, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Clock: func() time.Time { return per.End.Add(-time.Second) }, Logger: quietLog()})
	if due, err := early.Due(ctx); err != nil || len(due) != 0 {
		t.Fatalf("due before the end: %v, %v", due, err)
	}
	if _, err := early.Close(ctx, orgs[0], per.ID); err == nil {
		t.Fatal("closed a period before its end")
	}

	// Half the orgs: both workers' closers close them directly, at the same moment.
	racing := orgs[:nOrgs/2]
	var wg sync.WaitGroup
	won := make([]int, len(racing))
	var mu sync.Mutex
	for _, cl := range []*billing.Closer{closer1, closer2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, org := range racing {
				res, err := cl.Close(ctx, org, per.ID)
				if err != nil {
					t.Error(err)
				}
				if !res.AlreadyClosed {
					mu.Lock()
					won[i]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for i, n := range won {
		if n != 1 {
			t.Errorf("%s: closed by %d of the two racing closers, want 1", racing[i], n)
		}
	}
	// Then both workers run the scan and enqueue every close job at once: River keeps
	// one job per org and period, and the jobs close the other half.
	for _, c := range []*river.Client[pgx.Tx]{c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Insert(ctx, worker.CloseScanArgs{}, nil); err != nil {
				t.Error(err)
			}
			for _, org := range orgs {
				if _, err := c.Insert(ctx, worker.CloseArgs{Org: org, Period: per.ID}, nil); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	waitFor(t, 30*time.Second, "close jobs to complete", func() bool {
		return e.count(`SELECT count(*) FROM river_job WHERE kind = 'billing.close_period' AND state = 'completed'`) == nOrgs
	})
	rows, _ := e.Pool.Query(ctx, `SELECT closed_by, count(*) FROM billing_periods GROUP BY 1 ORDER BY 1`)
	byWorker, _ := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var w string
		var n int
		err := r.Scan(&w, &n)
		return fmt.Sprintf("%s=%d", w, n), err
	})
	t.Logf("%d orgs closed once each (closed_by %v); close jobs in River: %d", nOrgs, byWorker,
		e.count(`SELECT count(*) FROM river_job WHERE kind = 'billing.close_period'`))

	for _, org := range orgs {
		if n := e.count(`SELECT count(*) FROM billing_periods WHERE org_id = $1`, org); n != 1 {
			t.Errorf("%s: %d closed periods, want 1", org, n)
		}
		if n := e.count(`SELECT count(*) FROM billing_events WHERE org_id = $1 AND type = 'period.closed'`, org); n != 1 {
			t.Errorf("%s: %d period.closed events, want 1", org, n)
		}
		if n := e.count(`SELECT count(*) FROM river_job WHERE kind = 'billing.close_period' AND args->>'org' = $1`, org); n != 1 {
			t.Errorf("%s: %d close jobs, want 1 (unique per org and period)", org, n)
		}
	}

	// Billing rows match usage and pricing.
	for i, org := range orgs {
		live, err := e.Engine.MonthUsage(ctx, org, per.ID)
		if err != nil {
			t.Fatal(err)
		}
		final, limits, closed, err := e.store.ClosedUsage(ctx, org, per.ID)
		if err != nil || !closed {
			t.Fatalf("closed usage: %v %v", closed, err)
		}
		if diff := cmp.Diff(live, final); diff != "" {
			t.Errorf("%s: closed usage differs from Redis (-redis +closed):\n%s", org, diff)
		}
		orgC := quota.Counter{Metric: "requests", Level: vocab.LevelOrg}
		if final[orgC] != admitted[org] {
			t.Errorf("%s: closed %d units, %d admitted", org, final[orgC], admitted[org])
		}
		if limits[orgC] != 10_000 || limits[quota.Counter{Metric: "requests", Level: vocab.LevelUser, Team: "eng", User: "u0"}] != 1000 {
			t.Errorf("%s: month limits at close %v", org, limits)
		}
		var units, included, overage int64
		var amount, currency string
		if err := e.Pool.QueryRow(ctx, `SELECT units, included_units, overage_units, trim_scale(amount)::text, currency
			FROM billing_lines WHERE org_id = $1 AND metric = 'requests'`, org).Scan(&units, &included, &overage, &amount, &currency); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("%d/%d/%d/%s/%s", admitted[org], 0, 0, "0", "")
		if i%2 == 0 {
			over := max(admitted[org]-100, 0)
			want = fmt.Sprintf("%d/%d/%d/%s/%s", admitted[org], 100, over, decimal(over*15, 3), "EUR")
			// the priced metric without usage gets its line too
			if n := e.count(`SELECT count(*) FROM billing_lines WHERE org_id = $1 AND metric = 'tokens' AND units = 0`, org); n != 1 {
				t.Errorf("%s: no zero line for priced tokens", org)
			}
		}
		if got := fmt.Sprintf("%d/%d/%d/%s/%s", units, included, overage, amount, currency); got != want {
			t.Errorf("%s: billing line %s, want %s", org, got, want)
		}
	}

	// A second run, by jobs and directly, changes no row.
	before := e.snapshot()
	for _, org := range orgs {
		res, err := closer2.Close(ctx, org, per.ID)
		if err != nil || !res.AlreadyClosed {
			t.Fatalf("second close of %s: %+v, %v", org, res, err)
		}
	}
	if _, err := c1.Insert(ctx, worker.CloseScanArgs{}, &river.InsertOpts{UniqueOpts: river.UniqueOpts{}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if diff := cmp.Diff(before, e.snapshot()); diff != "" {
		t.Fatalf("second run changed rows:\n%s", diff)
	}
	// Immutable: Postgres refuses to change a closed row.
	if _, err := e.Pool.Exec(ctx, `UPDATE period_usage SET units = 0 WHERE org_id = $1`, orgs[0]); err == nil ||
		!strings.Contains(err.Error(), "immutable") {
		t.Fatalf("update of a closed row: %v", err)
	}

	// A late check in the closed period (a replica whose clock lags) is flushed after
	// the close: it becomes an adjustment, and the export counts it.
	if _, err := e.Check(e.Engine, orgs[1], "eng", "u1", "requests", 7); err != nil {
		t.Fatal(err)
	}
	admitted[orgs[1]] += 7
	if _, err := e.Flusher(time.Hour).FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT coalesce(sum(units), 0)::int FROM usage_adjustments WHERE org_id = $1 AND level = 'org'`, orgs[1]); n != 7 {
		t.Fatalf("late units recorded as adjustment: %d, want 7", n)
	}
	var total int64
	if err := e.store.Export(ctx, orgs[1], per.ID, func(r *billing.Row) error {
		if r.Team == "" && r.Metric == "requests" {
			total = r.Units
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if total != admitted[orgs[1]] {
		t.Fatalf("export after a late flush: %d units, %d admitted", total, admitted[orgs[1]])
	}
}

// decimal formats n / 10^scale without trailing zeros, as Postgres's trim_scale does.
func decimal(n int64, scale int) string {
	s := fmt.Sprintf("%0*d", scale+1, n)
	s = s[:len(s)-scale] + "." + s[len(s)-scale:]
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

// An org with a billing anchor day has its own periods: it is due one anchor-month
// after its period starts, not at the calendar month's end.
func TestAnchorDayPeriodsCloseOnTheirOwnBoundary(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 100)}, nil, tenants.TeamInput{ID: "eng"})
	day := 15
	if _, err := e.Svc.UpdateOrg(ctx, operator, org, tenants.OrgPatch{BillingAnchorDay: &day}); err != nil {
		t.Fatal(err)
	}
	p, err := billing.PeriodOf("2026-11", 15)
	if err != nil || p.Start != time.Date(2026, 11, 15, 0, 0, 0, 0, time.UTC) || p.End != time.Date(2026, 12, 15, 0, 0, 0, 0, time.UTC) {
		t.Fatalf("PeriodOf(2026-11, 15) = %+v, %v", p, err)
	}
	cur := vocab.PeriodAt(time.Now(), 15)
	closerAt := func(at time.Time) *billing.Closer {
		return billing.NewCloser(billing.CloserConfig{Store: e.store, Tenants: e.Svc, Counters: oneEngine(e.Engine),
			Clock: func() time.Time { return at }, Logger: quietLog()})
	}
	if due, err := closerAt(cur.End.Add(-time.Second)).Due(ctx); err != nil || len(due) != 0 {
		t.Fatalf("due before the anchor boundary: %v, %v", due, err)
	}
	if _, err := closerAt(cur.End.Add(-time.Second)).Close(ctx, org, cur.ID); !errors.Is(err, billing.ErrNotDue) {
		t.Fatalf("close before the boundary: %v, want ErrNotDue", err)
	}
	after := closerAt(cur.End.Add(2 * time.Minute))
	due, err := after.Due(ctx)
	if err != nil || len(due) != 1 || due[0] != (billing.OrgPeriod{Org: org, Period: cur.ID}) {
		t.Fatalf("due after the boundary: %v, %v; want %s %s", due, err, org, cur.ID)
	}
	if _, err := e.Check(e.Engine, org, "eng", "alice", "requests", 4); err != nil {
		t.Fatal(err)
	}
	if _, err := after.Close(ctx, org, cur.ID); err != nil {
		t.Fatal(err)
	}
	var start, end time.Time
	if err := e.Pool.QueryRow(ctx, `SELECT period_start, period_end FROM billing_periods WHERE org_id = $1`, org).Scan(&start, &end); err != nil ||
		!start.Equal(cur.Start) || !end.Equal(cur.End) {
		t.Fatalf("closed period %s..%s (%v), want %s..%s", start, end, err, cur.Start, cur.End)
	}
	if due, _ := after.Due(ctx); len(due) != 0 {
		t.Fatalf("still due after the close: %v", due)
	}
}

// A period's close deletes the org's settled reservation rows of that period and
// earlier ones more than a day past their expiry (nobody reads them: GET reads Redis,
// which keeps a settled record a day, and hydration restores held ones and the last
// day's); held rows, rows settled within the day, later periods' and other orgs' stay.
// Before, every reservation row was kept for ever.
func TestCloseDeletesSettledReservationRows(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org, other := testenv.ID(t, "org"), testenv.ID(t, "other")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 100)}, nil)
	e.Seed(other, []vocab.Limit{monthLimit("requests", 100)}, nil)
	cur := vocab.PeriodAt(time.Now(), 1)
	at := cur.End.Add(2 * time.Minute)
	next := vocab.PeriodAt(at, 1)
	rows := []struct {
		org, id, period, state string
		expired                time.Duration // before the close
		kept                   bool
	}{
		{org, "r_committed2daysago00000", cur.ID, "committed", 48 * time.Hour, false},
		{org, "r_expired40daysago000000", "2000-01", "expired", 40 * 24 * time.Hour, false},
		{org, "r_released1hourago000000", cur.ID, "released", time.Hour, true},
		{org, "r_held2daysago0000000000", cur.ID, "held", 48 * time.Hour, true},
		{org, "r_nextperiod000000000000", next.ID, "committed", 48 * time.Hour, true},
		{other, "r_otherorg00000000000000", cur.ID, "committed", 48 * time.Hour, true},
	}
	for _, r := range rows {
		if _, err := e.Pool.Exec(ctx, `INSERT INTO reservations (org_id, id, period, state, expires_at, record)
			VALUES ($1, $2, $3, $4, $5, '{}')`, r.org, r.id, r.period, r.state, at.Add(-r.expired)); err != nil {
			t.Fatal(err)
		}
	}
	closer := billing.NewCloser(billing.CloserConfig{Store: e.store, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Clock: func() time.Time { return at }, Logger: quietLog()})
	if _, err := closer.Close(ctx, org, cur.ID); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		n := e.count(`SELECT count(*) FROM reservations WHERE org_id = $1 AND id = $2`, r.org, r.id)
		if kept := n == 1; kept != r.kept {
			t.Errorf("%s (%s, %s, expired %s before the close): kept %v, want %v", r.id, r.period, r.state, r.expired, kept, r.kept)
		}
	}
}
