package quota_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// wbRow is a would-block row without its day.
type wbRow struct {
	Metric, Team, User string
	Level              vocab.Level
	Window             vocab.Window
}

// byRow sums a record's counts over days.
func byRow(rec quota.WouldBlockRecord) map[wbRow]quota.WouldBlockCount {
	out := map[wbRow]quota.WouldBlockCount{}
	for k, c := range rec.Counts {
		r := wbRow{Metric: k.Metric, Team: k.Team, User: k.User, Level: k.Level, Window: k.Window}
		o := out[r]
		out[r] = quota.WouldBlockCount{Checks: o.Checks + c.Checks, Units: o.Units + c.Units}
	}
	return out
}

func mustRecord(tb testing.TB, r *testRig, org string) quota.WouldBlockRecord {
	tb.Helper()
	ctx := context.Background()
	if err := r.e.FlushWouldBlock(ctx); err != nil {
		tb.Fatal(err)
	}
	rec, err := r.e.WouldBlock(ctx, org, r.e.Period(1).ID)
	if err != nil {
		tb.Fatal(err)
	}
	return rec
}

// TestWouldBlockCountsExactUnderConcurrency runs shadow and warn checks over their
// limits from many goroutines, single and batched, with replays of idempotency keys,
// while the engine flushes every few milliseconds, and compares the record with the
// would-block answers the callers received: per row, checks and units exactly.
func TestWouldBlockCountsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{WouldBlockFlush: 3 * time.Millisecond})
	org := testenv.ID(t, "org")
	var mu sync.Mutex
	want := map[wbRow]quota.WouldBlockCount{}
	note := func(req quota.Request, res vocab.Result) {
		b := res.WouldBlock
		if b == nil || res.Replayed {
			return
		}
		if !res.Allowed {
			t.Errorf("shadow check denied: %+v", res)
		}
		row := wbRow{Metric: req.Metric, Level: b.Level, Window: b.Window}
		if b.Level != vocab.LevelOrg {
			row.Team = req.Team
		}
		if b.Level == vocab.LevelUser {
			row.User = req.User
		}
		mu.Lock()
		c := want[row]
		want[row] = quota.WouldBlockCount{Checks: c.Checks + 1, Units: c.Units + req.Cost}
		mu.Unlock()
	}
	request := func(g, i int) quota.Request {
		replay := i%10 == 0
		if replay {
			i -= i % 20 // every other one repeats the one 10 before, key and all
		}
		mode := vocab.Shadow
		if g%3 == 0 {
			mode = vocab.Warn
		}
		req := quota.Request{Org: org, Team: fmt.Sprintf("team-%d", g%4), User: fmt.Sprintf("user-%d", i%7),
			Metric: []string{"requests", "tokens"}[i%2], Cost: int64(1 + i%3), Mode: mode,
			Limits: quota.LevelLimits{
				Org:  []vocab.Limit{lim(vocab.Month, 400)},
				Team: []vocab.Limit{lim(vocab.Minute, 60)},
				User: []vocab.Limit{lim(vocab.Month, 5)},
			}}
		if replay {
			req.IdempotencyKey = fmt.Sprintf("idem-%d-%d", g, i)
		}
		return req
	}
	const goroutines, perG = 24, 60
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			ctx := context.Background()
			for i := 0; i < perG; i++ {
				if i%15 == 14 { // a batch of five
					reqs := make([]quota.Request, 5)
					for j := range reqs {
						reqs[j] = request(g, 1000+i*5+j)
					}
					res, errs := r.e.CheckBatch(ctx, reqs)
					for j := range reqs {
						if errs[j] != nil {
							t.Error(errs[j])
							return
						}
						note(reqs[j], res[j])
					}
					continue
				}
				req := request(g, i)
				res, err := r.e.Check(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				note(req, res)
			}
		})
	}
	wg.Wait()
	rec := mustRecord(t, r, org)
	if len(want) < 10 {
		t.Fatalf("only %d rows would have blocked: the test does not exercise the levels", len(want))
	}
	if diff := cmp.Diff(want, byRow(rec)); diff != "" {
		t.Errorf("record differs from the answers (-answers +record):\n%s", diff)
	}
	if rec.Rows != len(want) {
		t.Errorf("record has %d rows, want %d", rec.Rows, len(want))
	}
	if n := quota.WouldBlockPending(r.e); n != 0 {
		t.Errorf("%d rows still pending after a flush", n)
	}
}

// TestWouldBlockBoundedByCap blocks more distinct users than the cap: Redis keeps the
// cap's rows and counts the rest in the overflow row, so totals stay exact, the hash
// stays small, and the counts waiting in memory are bounded by the cap too.
func TestWouldBlockBoundedByCap(t *testing.T) {
	t.Parallel()
	const limit, users = 10, 300
	r := MustRig(t, "", quota.Config{WouldBlockCap: limit, WouldBlockFlush: time.Hour})
	org := testenv.ID(t, "org")
	check := func(i int) {
		r.MustCheck(t, quota.Request{Org: org, Team: "eng", User: fmt.Sprintf("user-%d", i), Metric: "requests",
			Cost: 2, Mode: vocab.Shadow, Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, 1)}}})
	}
	// Pending in memory, never flushed by the engine's own loop in this test.
	for i := range users {
		check(i)
	}
	if n := quota.WouldBlockPending(r.e); n > limit+1 {
		t.Errorf("%d rows pending in memory after %d distinct users, want at most the cap %d + the overflow row", n, users, limit)
	}
	rec := mustRecord(t, r, org)
	// A second round: the first 5 users are now known rows, the others overflow again.
	for i := range users {
		check(i)
	}
	rec = mustRecord(t, r, org)
	rows := byRow(rec)
	var checks, units int64
	for _, c := range rows {
		checks += c.Checks
		units += c.Units
	}
	if checks != 2*users || units != 2*2*users {
		t.Errorf("totals %d checks, %d units; want %d, %d", checks, units, 2*users, 4*users)
	}
	if rec.Rows != limit || len(rows) != limit+1 {
		t.Errorf("%d rows (%d distinct in the record), want the cap %d + the overflow row", rec.Rows, len(rows), limit)
	}
	other := rows[wbRow{Level: quota.LevelOther}]
	if other.Checks < 2*(users-2*limit) {
		t.Errorf("overflow row %+v, want at least %d checks", other, 2*(users-2*limit))
	}
	key := r.prefix + ":{" + org + "}|b|" + r.e.Period(1).ID
	if n := r.raw.HLen(context.Background(), key).Val(); n > 3+3*(limit+1) {
		t.Errorf("record hash has %d fields, want at most %d", n, 3+3*(limit+1))
	}
	if ttl := r.raw.PTTL(context.Background(), key).Val(); ttl <= 0 {
		t.Errorf("record hash has no expiry (%v)", ttl)
	}
}

// TestWouldBlockFlushOnClose: what is counted before Close reaches Redis.
func TestWouldBlockFlushOnClose(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{WouldBlockFlush: time.Hour})
	org := testenv.ID(t, "org")
	for range 3 {
		r.MustCheck(t, quota.Request{Org: org, Metric: "requests", Cost: 4, Mode: vocab.Warn,
			Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 1)}}})
	}
	if err := r.e.Close(); err != nil {
		t.Fatal(err)
	}
	rec, err := r.e.WouldBlock(context.Background(), org, r.e.Period(1).ID)
	if err != nil {
		t.Fatal(err)
	}
	want := map[wbRow]quota.WouldBlockCount{{Metric: "requests", Level: vocab.LevelOrg, Window: vocab.Minute}: {Checks: 3, Units: 12}}
	if diff := cmp.Diff(want, byRow(rec)); diff != "" {
		t.Errorf("record after Close (-want +got):\n%s", diff)
	}
}

// BenchmarkWouldBlockPath compares, in one run, checks that pass (enforce, under the
// limit: the path every allowed check takes, which only tests WouldBlock for nil) with
// checks that would have been blocked (shadow, over the limit: each one also recorded
// in the sharded in-process counters), from 64 goroutines through one engine. It
// fails if the record disagrees with the answers.
func BenchmarkWouldBlockPath(b *testing.B) {
	for _, tc := range []struct {
		name  string
		mode  vocab.Mode
		limit int64
	}{{"allowed", vocab.Enforce, 1 << 50}, {"would-block", vocab.Shadow, 0}} {
		b.Run(tc.name, func(b *testing.B) {
			r := MustRig(b, "", quota.Config{})
			org := testenv.ID(b, "org")
			reqs := benchRequests(org, tc.limit)
			for i := range reqs {
				reqs[i].Mode = tc.mode
			}
			r.MustCheck(b, quota.Request{Org: org, Metric: "warmup"})
			var blocked atomic.Int64
			var next atomic.Int64
			b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					res, err := r.e.Check(ctx, reqs[next.Add(1)%int64(len(reqs))])
					if err != nil {
						b.Error(err)
						return
					}
					if res.WouldBlock != nil {
						blocked.Add(1)
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/check")
			var recorded int64
			for _, c := range byRow(mustRecord(b, r, org)) {
				recorded += c.Checks
			}
			if recorded != blocked.Load() {
				b.Fatalf("recorded %d would-blocks, answered %d", recorded, blocked.Load())
			}
		})
	}
}

// BenchmarkWouldBlockRecord is the in-process cost of recording one would-block (the
// work a would-block check adds after its answer), from many goroutines over 8 orgs.
func BenchmarkWouldBlockRecord(b *testing.B) {
	r := MustRig(b, "", quota.Config{WouldBlockFlush: time.Hour})
	reqs := benchRequests("org", 1)
	for i := range reqs {
		reqs[i].Org = fmt.Sprintf("org-%d", i%8)
	}
	blocked := &vocab.Blocked{Level: vocab.LevelUser, Window: vocab.Minute}
	record := quota.WouldBlockRecorder(r.e, reqs, blocked)
	var next atomic.Int64
	b.SetParallelism(max(1, 64/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			record(int(next.Add(1) % int64(len(reqs))))
		}
	})
}
