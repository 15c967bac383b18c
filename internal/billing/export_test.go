package billing_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// exportRows writes an export in format and parses it back.
func exportRows(t *testing.T, s *billing.Store, org, period string, format billing.Format) ([]billing.Row, string) {
	t.Helper()
	var buf bytes.Buffer
	if err := s.WriteExport(context.Background(), &buf, org, period, format); err != nil {
		t.Fatal(err)
	}
	raw := buf.String()
	var rows []billing.Row
	read := billing.ReadJSON
	if format == billing.CSV {
		read = billing.ReadCSV
	}
	if err := read(&buf, func(r billing.Row) error { rows = append(rows, r); return nil }); err != nil {
		t.Fatalf("parse %s export: %v\n%s", format, err, raw)
	}
	return rows, raw
}

// The export of a period equals the sum of the checks admitted in it, before and
// after the close, and the CSV and JSON exports carry the same rows.
func TestExportEqualsAdmittedChecks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 100_000), monthLimit("tokens", 1_000_000)},
		&tenants.Pricing{Currency: "USD", BasePrice: "0", Metrics: []tenants.MetricPrice{{Metric: "tokens", IncludedUnits: 5000, OveragePrice: "0.002"}}},
		tenants.TeamInput{ID: "eng", UserLimits: []vocab.Limit{monthLimit("requests", 15)}},
		tenants.TeamInput{ID: "ops"}, tenants.TeamInput{ID: "sales"})
	rng := rand.New(rand.NewPCG(1, 2))
	admitted := map[string]int64{}
	denied := 0
	for i := range 600 {
		team := []string{"eng", "ops", "sales"}[rng.IntN(3)]
		user := fmt.Sprintf("user-%d", rng.IntN(20))
		if i%10 == 0 {
			user = "" // a team-level check
		}
		metric := []string{"requests", "tokens"}[rng.IntN(2)]
		cost := int64(1 + rng.IntN(9))
		if metric == "tokens" {
			cost *= 50
		}
		res, err := e.Check(e.Engine, org, team, user, metric, cost)
		if err != nil {
			t.Fatal(err)
		}
		if res.Allowed {
			admitted[metric] += cost
		} else {
			denied++
		}
	}
	if _, err := e.Flusher(time.Hour).FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	per := e.Engine.Period(1)

	verify := func(stage string) {
		csvRows, csvRaw := exportRows(t, e.store, org, per.ID, billing.CSV)
		jsonRows, _ := exportRows(t, e.store, org, per.ID, billing.JSON)
		if diff := cmp.Diff(csvRows, jsonRows); diff != "" {
			t.Fatalf("%s: CSV and JSON exports differ (-csv +json):\n%s", stage, diff)
		}
		if !strings.HasPrefix(csvRaw, "period,org,team,user,metric,units,included_units,overage_units,amount") {
			t.Fatalf("%s: CSV header: %q", stage, strings.SplitN(csvRaw, "\n", 2)[0])
		}
		detail, total := map[string]int64{}, map[string]int64{}
		for _, r := range csvRows {
			if r.Period != per.ID || r.Org != org {
				t.Fatalf("%s: row of another period or org: %+v", stage, r)
			}
			if r.Team == "" {
				total[r.Metric] = r.Units
				if r.Metric == "tokens" {
					over := max(r.Units-5000, 0)
					if r.IncludedUnits != 5000 || r.OverageUnits != over || r.Amount != decimal(over*2, 3) || r.Currency != "USD" {
						t.Errorf("%s: tokens total row %+v, want overage %d", stage, r, over)
					}
				} else if r.IncludedUnits != 0 || r.OverageUnits != 0 || r.Amount != "0" {
					t.Errorf("%s: unpriced total row %+v", stage, r)
				}
			} else {
				detail[r.Metric] += r.Units
			}
		}
		if diff := cmp.Diff(admitted, total); diff != "" {
			t.Errorf("%s: org totals differ from the admitted checks (-admitted +export):\n%s", stage, diff)
		}
		if diff := cmp.Diff(admitted, detail); diff != "" {
			t.Errorf("%s: detail rows differ from the admitted checks (-admitted +export):\n%s", stage, diff)
		}
		t.Logf("%s: %d rows; admitted %v (%d checks denied) = export totals %v = sum of detail rows %v",
			stage, len(csvRows), admitted, denied, total, detail)
	}
	verify("open period (ledger)")
	closer := billing.NewCloser(billing.CloserConfig{Store: e.store, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Clock: func() time.Time { return per.End.Add(time.Hour) }, Logger: quietLog()})
	if _, err := closer.Close(ctx, org, per.ID); err != nil {
		t.Fatal(err)
	}
	verify("closed period")
}

// fillLedger writes n users' usage of one org and period straight into the ledger
// (with their team and org sums), and returns the org's total.
func (e *env) fillLedger(org, period string, n int) int64 {
	e.T.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO usage_counters (org_id, period, metric, level, team_id, user_id, units)
		 SELECT $1, $2, 'requests', 'user', 'team-' || (i % 10), 'user-' || lpad(i::text, 7, '0'), (i % 97) + 1
		 FROM generate_series(1, $3::int) i`,
		`INSERT INTO usage_counters (org_id, period, metric, level, team_id, user_id, units)
		 SELECT $1, $2, 'requests', 'team', team_id, '', sum(units) FROM usage_counters
		 WHERE org_id = $1 AND period = $2 AND level = 'user' AND $3::int > 0 GROUP BY team_id`,
		`INSERT INTO usage_counters (org_id, period, metric, level, units)
		 SELECT $1, $2, 'requests', 'org', sum(units) FROM usage_counters
		 WHERE org_id = $1 AND period = $2 AND level = 'user' AND $3::int > 0`,
	} {
		if _, err := e.Pool.Exec(ctx, q, org, period, n); err != nil {
			e.T.Fatal(err)
		}
	}
	var total int64
	for i := 1; i <= n; i++ {
		total += int64(i%97) + 1
	}
	return total
}

// rowDigest folds rows, in order, into one hash, so two exports can be compared
// without keeping either in memory.
type rowDigest struct {
	h     [32]byte
	rows  int
	users int64
	total int64
}

func (d *rowDigest) add(r billing.Row) error {
	d.h = sha256.Sum256(fmt.Appendf(d.h[:], "%+v", r))
	d.rows++
	if r.Team == "" {
		d.total += r.Units
	} else {
		d.users += r.Units
	}
	return nil
}

// streamExport writes an export into a pipe that a parser reads as it comes, and
// samples the heap meanwhile. It returns the digest and the peak heap in use above
// the baseline.
func streamExport(t *testing.T, s *billing.Store, org, period string, format billing.Format) (rowDigest, uint64, time.Duration) {
	t.Helper()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			if m.HeapInuse > base && m.HeapInuse-base > peak.Load() {
				peak.Store(m.HeapInuse - base)
			}
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	pr, pw := io.Pipe()
	var d rowDigest
	parsed := make(chan error, 1)
	go func() {
		read := billing.ReadJSON
		if format == billing.CSV {
			read = billing.ReadCSV
		}
		err := read(pr, d.add)
		_, _ = io.Copy(io.Discard, pr)
		parsed <- err
	}()
	start := time.Now()
	err := s.WriteExport(context.Background(), pw, org, period, format)
	_ = pw.CloseWithError(err)
	if perr := <-parsed; err == nil {
		err = perr
	}
	took := time.Since(start)
	close(stop)
	<-sampled
	if err != nil {
		t.Fatalf("%s export: %v", format, err)
	}
	return d, peak.Load(), took
}

func procStatus(field string) string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "n/a"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			return strings.TrimSpace(strings.TrimPrefix(line, field+":"))
		}
	}
	return "n/a"
}

// The third "Done when": exports of 100,000 users stream with flat memory (peak heap
// while exporting 100,000 users is no bigger than while exporting 10,000), the CSV
// and JSON exports agree row for row, and the totals equal the usage.
func TestExport100kUsersStreamsWithFlatMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("large export")
	}
	e := newEnv(t)
	ctx := context.Background()
	period := e.Engine.Period(1).ID
	small, big := testenv.ID(t, "small"), testenv.ID(t, "big")
	e.Seed(small, nil, nil)
	e.Seed(big, nil, &tenants.Pricing{Currency: "EUR", BasePrice: "99", Metrics: []tenants.MetricPrice{
		{Metric: "requests", IncludedUnits: 1_000_000, OveragePrice: "0.0005"}}})
	wantSmall := e.fillLedger(small, period, 10_000)
	wantBig := e.fillLedger(big, period, 100_000)

	// Close the big org's period, so its export reads the immutable rows.
	per, _ := billing.PeriodOf(period, 1)
	closer := billing.NewCloser(billing.CloserConfig{Store: e.store, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Clock: func() time.Time { return per.End.Add(time.Hour) }, Logger: quietLog()})
	start := time.Now()
	res, err := closer.Close(ctx, big, period)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("closed %d usage rows of 100,000 users in %s", res.Counters, time.Since(start).Round(time.Millisecond))

	for _, format := range []billing.Format{billing.CSV, billing.JSON} {
		ds, peakSmall, _ := streamExport(t, e.store, small, period, format)
		db, peakBig, took := streamExport(t, e.store, big, period, format)
		if ds.users != wantSmall || ds.total != wantSmall || db.users != wantBig || db.total != wantBig {
			t.Fatalf("%s: units small %d/%d big %d/%d, want %d and %d", format, ds.users, ds.total, db.users, db.total, wantSmall, wantBig)
		}
		if db.rows != 100_000+1 {
			t.Fatalf("%s: %d rows, want 100,001 (no team rows: all usage has users)", format, db.rows)
		}
		t.Logf("%s: 10,000 users: peak heap +%.1f MiB; 100,000 users: %d rows in %s, peak heap +%.1f MiB; process VmRSS %s, VmHWM %s",
			format, float64(peakSmall)/(1<<20), db.rows, took.Round(time.Millisecond), float64(peakBig)/(1<<20),
			procStatus("VmRSS"), procStatus("VmHWM"))
		// Flat: ten times the rows may not need more than a few MiB more heap.
		if peakBig > peakSmall+8<<20 {
			t.Errorf("%s: peak heap grew with the rows: %d bytes for 10k users, %d for 100k", format, peakSmall, peakBig)
		}
	}
	// CSV and JSON agree row for row (compared by digest, nothing kept in memory).
	dc, _, _ := streamExport(t, e.store, big, period, billing.CSV)
	dj, _, _ := streamExport(t, e.store, big, period, billing.JSON)
	if dc != dj {
		t.Fatalf("CSV and JSON exports differ: %+v vs %+v", dc, dj)
	}
	// The all-orgs export holds both orgs.
	var all rowDigest
	if err := e.store.Export(ctx, "", period, func(r *billing.Row) error { return all.add(*r) }); err != nil {
		t.Fatal(err)
	}
	if all.rows != 110_002 || all.total != wantSmall+wantBig {
		t.Fatalf("all-orgs export: %d rows, total %d", all.rows, all.total)
	}
}
