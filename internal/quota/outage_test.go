package quota_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The fault tests of "Scale-out and faults": a Redis killed, then paused, under a
// continuous load of checks. They run in `go test ./...`, in parallel with the rest of
// the package, on 2 cores shared with race-detector builds: every timing bound is
// stated where it is asserted, and is applied to the time the process actually ran
// (testenv.StallWatch subtracts the seconds it is sometimes descheduled); both the
// raw and the corrected figures are logged.
const (
	// faultRedisTimeout is the EnginesConfig.RedisTimeout of these tests: 2.5x the
	// production 100 ms, so that a busy machine does not fail healthy checks, and
	// short against the outages (10 s, 2 s) it must bound.
	faultRedisTimeout = 250 * time.Millisecond
	// schedMargin is what the latency bounds allow on top of the Redis timeouts:
	// scheduling delays shorter than testenv.StallMin, which are not subtracted, and
	// may add up over the few hand-offs of a check (worker, engine loop, netpoller).
	// It is well below a timeout, so a bound of n timeouts plus the margin still tells
	// n from n+1 timeouts, and an answer bounded by the timeout from a hang.
	schedMargin = 100 * time.Millisecond
	// breakerOpen is the router's default BreakerConfig.OpenTimeout.
	breakerOpen = time.Second
	// loadWorkers is the number of goroutines issuing checks back to back.
	loadWorkers = 16
	// loadPause is each worker's think time between two checks: about 3,000 checks a
	// second per router at most, enough to keep every phase busy without using up
	// the CPU the parallel tests share.
	loadPause = 5 * time.Millisecond
)

// loadRecord is how one check of the load went.
type loadRecord struct {
	start    time.Time
	took     time.Duration
	allowed  bool
	degraded bool
	err      error
	blocked  vocab.Level // level that denied it, "" if allowed
	orgLimit int64       // the org level's Limit in the result (the local share when degraded)
	orgUsed  int64
}

func (rec *loadRecord) end() time.Time { return rec.start.Add(rec.took) }

// checkLoad runs loadWorkers goroutines that check req on route until stop. Every
// check runs on context.Background: nothing but the router bounds it, so a check
// that hangs hangs its worker, and stop reports it.
type checkLoad struct {
	done      chan struct{}
	once      sync.Once
	wg        sync.WaitGroup
	recs      [loadWorkers][]loadRecord // one slice per worker: no lock on the hot path
	lastExact atomic.Int64              // UnixNano of the latest answer Redis decided
}

// startLoad starts the load; it is stopped when the test ends at the latest.
func startLoad(tb testing.TB, r *quota.Engines, route vocab.Route, req quota.Request) *checkLoad {
	l := &checkLoad{done: make(chan struct{})}
	tb.Cleanup(func() { l.stop(tb) })
	for w := range loadWorkers {
		l.wg.Go(func() {
			for {
				select {
				case <-l.done:
					return
				default:
				}
				t0 := time.Now()
				res, out, err := r.Check(context.Background(), route, req)
				rec := loadRecord{start: t0, took: time.Since(t0), allowed: res.Allowed, degraded: out.Degraded, err: err}
				if res.BlockedAt != nil {
					rec.blocked = res.BlockedAt.Level
				}
				if len(res.Levels) > 0 && res.Levels[0].Level == vocab.LevelOrg {
					rec.orgLimit, rec.orgUsed = res.Levels[0].Limit, res.Levels[0].Used
				}
				if err == nil && !out.Degraded {
					l.lastExact.Store(rec.end().UnixNano())
				}
				l.recs[w] = append(l.recs[w], rec)
				time.Sleep(loadPause)
			}
		})
	}
	return l
}

// exactSince reports whether Redis decided a check of the load after t.
func (l *checkLoad) exactSince(t time.Time) bool { return l.lastExact.Load() > t.UnixNano() }

// stop ends the load and returns every check, in order of start. A worker still
// stuck in a check 10 s later is a hang: the test fails with the goroutines' stacks.
func (l *checkLoad) stop(tb testing.TB) []loadRecord {
	tb.Helper()
	l.once.Do(func() { close(l.done) })
	finished := make(chan struct{})
	go func() { l.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		buf := make([]byte, 1<<20)
		tb.Fatalf("a check has not returned 10s after the load stopped (hang)\n%s", buf[:runtime.Stack(buf, true)])
	}
	var all []loadRecord
	for _, rs := range l.recs {
		all = append(all, rs...)
	}
	slices.SortFunc(all, func(a, b loadRecord) int { return a.start.Compare(b.start) })
	return all
}

// stalledOver reports whether the process stalled for at least half a Redis timeout
// while rec was in flight or in the breaker's open time before it: long enough for
// a reply already received to be read after its deadline, and for the failures that
// follow to open the breaker. An answer degraded then may be the machine's doing.
func stalledOver(st *testenv.StallWatch, rec loadRecord, openTimeout time.Duration) bool {
	return st.Within(rec.start.Add(-openTimeout-faultRedisTimeout), rec.end()) >= faultRedisTimeout/2
}

// running returns how long each check ran: its latency minus the stalls it overlapped.
func running(st *testenv.StallWatch, recs []loadRecord) []time.Duration {
	d := make([]time.Duration, len(recs))
	for i, rec := range recs {
		d[i] = st.Running(rec.start, rec.end())
	}
	return d
}

// isTimeout reports whether err is a Redis reply that did not come in time: the
// command may have run.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// between returns the checks that started at or after from and ended before to.
func between(recs []loadRecord, from, to time.Time) []loadRecord {
	var out []loadRecord
	for _, rec := range recs {
		if !rec.start.Before(from) && rec.end().Before(to) {
			out = append(out, rec)
		}
	}
	return out
}

func latencies(recs []loadRecord) []time.Duration {
	d := make([]time.Duration, len(recs))
	for i := range recs {
		d[i] = recs[i].took
	}
	return d
}

// faultLabel is the pprof label that marks a subtest's goroutines.
const faultLabel = "quota-fault-test"

// labelGoroutines labels the calling (test) goroutine, so that every goroutine it
// starts from now on, and every goroutine those start, carries the label: the load
// workers, and the engine loops and go-redis dialers and probes the router starts on
// their behalf. ownGoroutines then counts them alone, whatever runs in parallel
// (runtime.NumGoroutine counts the whole test binary).
func labelGoroutines(t *testing.T) string {
	pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels(faultLabel, t.Name())))
	t.Cleanup(func() { pprof.SetGoroutineLabels(context.Background()) })
	return t.Name()
}

// ownGoroutines counts the live goroutines labelled with value by labelGoroutines.
func ownGoroutines(tb testing.TB, value string) int {
	tb.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		tb.Fatal(err)
	}
	// debug=1 prints "<count> @ <pcs>" then, for labelled stacks, "# labels: {...}".
	want := fmt.Sprintf("%q:%q", faultLabel, value)
	n, count := 0, 0
	for line := range strings.Lines(buf.String()) {
		if c, _, ok := strings.Cut(line, " @ "); ok {
			count, _ = strconv.Atoi(c)
			continue
		}
		if strings.HasPrefix(line, "# labels: ") && strings.Contains(line, want) {
			n += count
		}
	}
	return n
}

// resources is what must come back to its baseline once Redis is back.
type resources struct {
	goroutines int
	conns      quota.PoolStats
}

func (a resources) String() string {
	return fmt.Sprintf("%d goroutines, %d connections (%d idle)", a.goroutines, a.conns.TotalConns, a.conns.IdleConns)
}

func measure(tb testing.TB, r *quota.Engines, label string) resources {
	return resources{goroutines: ownGoroutines(tb, label), conns: r.PoolStats()[quota.DefaultPool]}
}

// baseline samples the resources for a while under healthy load and keeps the
// highest of each figure: a dial in progress or a connection just checked out is
// part of normal operation.
func baseline(tb testing.TB, r *quota.Engines, label string) resources {
	var b resources
	for range 10 {
		m := measure(tb, r, label)
		b.goroutines = max(b.goroutines, m.goroutines)
		b.conns.TotalConns = max(b.conns.TotalConns, m.conns.TotalConns)
		b.conns.IdleConns = max(b.conns.IdleConns, m.conns.IdleConns)
		time.Sleep(50 * time.Millisecond)
	}
	return b
}

// Tolerances of the return to baseline, above the highest healthy sample. Left
// over from the outage, one goroutine (go-redis's background dial probe, a dial of
// a new connection) or one connection (a fresh one not yet idle) may still be
// settling; a leak per failed check or per probe would be hundreds.
const (
	goroutineTolerance = 1
	connTolerance      = 1
)

func (a resources) within(b resources) bool {
	return a.goroutines <= b.goroutines+goroutineTolerance &&
		a.conns.TotalConns <= b.conns.TotalConns+connTolerance &&
		a.conns.IdleConns <= b.conns.IdleConns+connTolerance
}

// orgMonthCount reads org's month counter of metric "requests" at level org on c.
func orgMonthCount(tb testing.TB, c *redis.Client, org string) int64 {
	tb.Helper()
	for _, k := range keysOfOrg(tb, c, org) {
		if strings.Contains(k, "|m|") {
			n, err := c.HGet(context.Background(), k, "requests|o").Int64()
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// TestRedisKilledUnderLoad kills (SIGKILL) a pool's Redis for 10 s while 16
// goroutines check continuously, for each fail mode on its own private Redis, and
// asserts that every check is answered, fast, by the fail mode; that the breaker opens
// within a second; and that once Redis is back Redis decides again and the
// goroutines and connections return to what they were before the outage.
func TestRedisKilledUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		outage   = 10 * time.Second
		replicas = 2
		limit    = 2000 // org, per month: the local share is 1000
	)
	for _, mode := range []vocab.FailMode{vocab.FailOpen, vocab.FailClosed, vocab.FailLocal} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			srv := MustPrivateRedis(t)
			r, _ := MustEngines(t, quota.EnginesConfig{DefaultURL: srv.URL(), Replicas: replicas, RedisTimeout: faultRedisTimeout})
			label := labelGoroutines(t)
			stalls := testenv.WatchStalls(t) // labelled too: one more goroutine in every count
			ctx := context.Background()
			route := vocab.Route{FailMode: mode}
			// Month, not a sliding window: the local limiter's window (the billing
			// period) does not roll over during the test.
			req := quota.Request{Org: testenv.ID(t, "org"), Team: "eng", User: "u", Metric: "requests", Cost: 1,
				Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, limit)}}}
			if _, out, err := r.Check(ctx, route, req); err != nil || out.Degraded {
				t.Fatalf("healthy check: %+v, %v", out, err)
			}

			load := startLoad(t, r, route, req)
			time.Sleep(time.Second)
			base := baseline(t, r, label)
			for wait := time.Now(); r.PoolStates()[quota.DefaultPool] != "closed"; time.Sleep(10 * time.Millisecond) {
				if time.Since(wait) > 5*time.Second { // a stall may have opened it; it closes by itself
					t.Fatalf("breaker %s for 5s before the outage", r.PoolStates()[quota.DefaultPool])
				}
			}

			// The outage. The breaker opens within a second of the kill.
			killAt := time.Now()
			srv.Kill(t)
			killed := time.Now()
			for r.PoolStates()[quota.DefaultPool] != "open" {
				if stalls.Running(killAt, time.Now()) > 3*time.Second {
					t.Fatalf("breaker still %s 3s after the kill", r.PoolStates()[quota.DefaultPool])
				}
				time.Sleep(time.Millisecond)
			}
			openedAt := time.Now()
			opened := stalls.Running(killAt, openedAt)
			if opened > time.Second {
				t.Errorf("breaker open %v after the kill (%v stalled), want within 1s", openedAt.Sub(killAt), openedAt.Sub(killAt)-opened)
			}
			time.Sleep(outage - time.Since(killAt))
			during := measure(t, r, label)
			restartAt := time.Now()
			srv.Restart(t)
			restarted := time.Now()

			// Recovery, within 5 s: Redis decides again, and goroutines and connections
			// are back to the baseline (three samples in a row, 50 ms apart).
			var exact, settled time.Duration // running time from the restart
			var exactAt time.Time
			var last resources
			for streak := 0; exact == 0 || streak < 3; {
				if stalls.Running(restarted, time.Now()) > 5*time.Second {
					t.Errorf("5s after the restart: Redis decided again: %v; %v, baseline %v (tolerance +%d goroutine, +%d connection)",
						exact != 0, last, base, goroutineTolerance, connTolerance)
					break
				}
				if exact == 0 && load.exactSince(restarted) && r.PoolStates()[quota.DefaultPool] == "closed" {
					exactAt = time.Now()
					exact = stalls.Running(restarted, exactAt)
				}
				if last = measure(t, r, label); last.within(base) {
					if streak == 0 {
						settled = stalls.Running(restarted, time.Now())
					}
					streak++
				} else {
					streak = 0
				}
				time.Sleep(50 * time.Millisecond)
			}
			recovered := time.Since(restarted)

			// Exact again, under the load: Redis counts a fresh org to its limit. A
			// stall may time out a check; the sequence then starts over, three times at most.
			for attempt := 1; ; attempt++ {
				exactReq := quota.Request{Org: testenv.ID(t, "org"), Metric: "requests", Cost: 1,
					Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 3)}}}
				var bad []string
				seqStart := time.Now()
				for i := range 4 {
					res, out, err := r.Check(ctx, route, exactReq)
					if err != nil || out.Degraded || res.Allowed != (i < 3) || res.Levels[0].Used != min(int64(i+1), 3) {
						bad = append(bad, fmt.Sprintf("check %d: %+v, %+v, %v; want allowed %v, used %d, not degraded",
							i, res, out, err, i < 3, min(i+1, 3)))
					}
				}
				if bad == nil {
					break
				}
				if attempt == 3 || stalls.Within(seqStart.Add(-breakerOpen-faultRedisTimeout), time.Now()) < faultRedisTimeout/2 {
					t.Errorf("exact checks after recovery:\n%s", strings.Join(bad, "\n"))
					break
				}
				t.Logf("exact checks after recovery, attempt %d, failed during a stall; again: %s", attempt, bad[0])
			}
			recs := load.stop(t)

			// Every check was answered: with an error only for fail-closed, and that
			// error is ErrUnavailable.
			var wrong []string
			for _, rec := range recs {
				if rec.err != nil && (mode != vocab.FailClosed || !errors.Is(rec.err, quota.ErrUnavailable)) {
					wrong = append(wrong, rec.err.Error())
				}
			}
			if len(wrong) > 0 {
				t.Errorf("%d checks failed other than by the fail mode, first: %s", len(wrong), wrong[0])
			}

			// During the outage (started after the kill, ended before the restart):
			// degraded, by the mode, and bounded by the Redis timeout.
			out := between(recs, killed, restartAt)
			if len(out) < 1000 {
				t.Fatalf("only %d checks during the outage: the load is too thin to mean anything", len(out))
			}
			allowed, denied := 0, 0
			for i, rec := range out {
				if !rec.degraded {
					t.Fatalf("outage check %d (at +%v) not degraded: %+v", i, rec.start.Sub(killAt), rec)
				}
				switch mode {
				case vocab.FailOpen:
					if rec.err != nil || !rec.allowed || rec.orgUsed != 0 || rec.orgLimit != limit {
						t.Fatalf("fail-open outage check %d: %+v; want allowed, used 0 of %d", i, rec, limit)
					}
				case vocab.FailClosed:
					if !errors.Is(rec.err, quota.ErrUnavailable) {
						t.Fatalf("fail-closed outage check %d: %+v; want ErrUnavailable", i, rec)
					}
				case vocab.FailLocal:
					if rec.err != nil || rec.orgLimit != limit/replicas {
						t.Fatalf("fail-local outage check %d: %+v; want the share %d as the limit", i, rec, limit/replicas)
					}
					if rec.allowed {
						allowed++
					} else if denied++; rec.blocked != vocab.LevelOrg {
						t.Fatalf("fail-local outage check %d denied at %q, want org", i, rec.blocked)
					}
				}
			}
			if mode == vocab.FailLocal {
				// The local limiter counts every degraded answer, including those of the
				// few milliseconds between SIGKILL and the outage window above.
				allowed = 0
				for _, rec := range recs {
					if rec.degraded && rec.allowed {
						allowed++
					}
				}
				if allowed != limit/replicas {
					t.Errorf("fail-local: %d degraded checks allowed; want exactly the share %d (limit %d / %d replicas)",
						allowed, limit/replicas, limit, replicas)
				}
			}
			raw, ran := latencies(out), running(stalls, out)
			// p99 bound: one Redis timeout (a half-open probe or a check caught on a
			// dying connection waits at most that) plus scheduling.
			if bound := faultRedisTimeout + schedMargin; p99(ran) > bound {
				t.Errorf("p99 of the outage's answers %v (%v with stalls), want <= %v (RedisTimeout %v + %v)",
					p99(ran), p99(raw), bound, faultRedisTimeout, schedMargin)
			}
			// Max bound: a check may queue behind one pipeline in flight, then time out
			// itself: two timeouts.
			if bound := 2*faultRedisTimeout + schedMargin; maxDur(ran) > bound {
				t.Errorf("slowest answer of the outage %v (%v with stalls), want <= %v (2 x RedisTimeout + %v)",
					maxDur(ran), maxDur(raw), bound, schedMargin)
			}

			// Once Redis decided again, it decided everything, unless the process
			// stalled long enough to time a reply out.
			var after []loadRecord
			excused := 0
			if exact > 0 {
				after = between(recs, exactAt, time.Now())
			}
			for i, rec := range after {
				if rec.degraded || rec.err != nil {
					if stalledOver(stalls, rec, breakerOpen) {
						excused++
						continue
					}
					t.Fatalf("check %d after recovery (at +%v from the restart) degraded: %+v", i, rec.start.Sub(restarted), rec)
				}
			}
			healthy := between(recs, time.Time{}, killAt)
			longest, nstalls := stalls.Longest()

			t.Logf("%s: breaker open %v after SIGKILL; %d checks answered during the %v outage (%d/s), p99 %v, max %v (raw: p99 %v, max %v)",
				mode, opened.Round(time.Millisecond), len(out), outage, len(out)*int(time.Second)/int(restartAt.Sub(killed)),
				p99(ran).Round(10*time.Microsecond), maxDur(ran).Round(10*time.Microsecond),
				p99(raw).Round(10*time.Microsecond), maxDur(raw).Round(10*time.Microsecond))
			if mode == vocab.FailLocal {
				t.Logf("%s: %d allowed locally (the share: %d / %d replicas), %d denied locally during the outage", mode, allowed, limit, replicas, denied)
			}
			t.Logf("%s: before the kill: %v (healthy p99 %v over %d checks); end of the outage: %v; after the restart: Redis decided again at +%v, back to the baseline from +%v (%v, 3 samples to +%v); %d checks after, all decided (%d excused by stalls)",
				mode, base, p99(latencies(healthy)).Round(10*time.Microsecond), len(healthy), during,
				exact.Round(time.Millisecond), settled.Round(time.Millisecond), last, recovered.Round(time.Millisecond), len(after), excused)
			t.Logf("%s: process stalls (>= %v): %d, longest %v", mode, testenv.StallMin, nstalls, longest.Round(time.Millisecond))
		})
	}
}

// TestRedisPausedUnderLoad pauses Redis (CLIENT PAUSE 2000 ALL) under load. Its
// RedisTimeout (250 ms) is shorter than the pause, by choice: checks during the pause
// are answered by the fail mode (closed: ErrUnavailable), p99 within the timeout and
// each within two (one pipeline ahead of it, then its own), not decided late when the
// pause ends. The commands sent to the paused Redis wait there; each client gives up
// on its connection at the timeout and closes it, and Redis drops a closed client's
// postponed command, so none of them runs when the pause ends. Hence the exact
// assertion: Redis's counter equals the number of checks Redis answered allowed.
func TestRedisPausedUnderLoad(t *testing.T) {
	t.Parallel()
	const (
		pause       = 2 * time.Second
		openTimeout = 3 * time.Second
	)
	srv := MustPrivateRedis(t)
	// The breaker stays open 3 s, longer than the pause: no half-open probe is in
	// flight when the pause ends, so Redis cannot run a command the very moment its
	// client times out (counted, yet answered as a failure: "at most once", legitimate,
	// but no longer exact).
	r, _ := MustEngines(t, quota.EnginesConfig{DefaultURL: srv.URL(), RedisTimeout: faultRedisTimeout,
		Breaker: quota.BreakerConfig{OpenTimeout: openTimeout}})
	stalls := testenv.WatchStalls(t)
	ctx := context.Background()
	route := vocab.Route{FailMode: vocab.FailClosed}
	org := testenv.ID(t, "org")
	req := quota.Request{Org: org, Team: "eng", User: "u", Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1_000_000)}}}
	if _, out, err := r.Check(ctx, route, req); err != nil || out.Degraded {
		t.Fatalf("healthy check: %+v, %v", out, err)
	}

	load := startLoad(t, r, route, req)
	time.Sleep(time.Second)
	for wait := time.Now(); r.PoolStates()[quota.DefaultPool] != "closed"; time.Sleep(10 * time.Millisecond) {
		if time.Since(wait) > 5*time.Second {
			t.Fatalf("breaker %s for 5s before the pause", r.PoolStates()[quota.DefaultPool])
		}
	}
	pauseAt := time.Now()
	if err := srv.raw.Do(ctx, "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	resumeAt := pauseAt.Add(pause) // Redis paused after pauseAt: it resumes after this
	for r.PoolStates()[quota.DefaultPool] != "open" {
		if time.Now().After(resumeAt) {
			t.Fatalf("breaker still %s at the end of the pause (the process stalled %v of it)",
				r.PoolStates()[quota.DefaultPool], stalls.Within(pauseAt, time.Now()))
		}
		time.Sleep(time.Millisecond)
	}
	opened := stalls.Running(pauseAt, time.Now())
	time.Sleep(time.Until(resumeAt))
	for !load.exactSince(resumeAt) {
		// The breaker's open time, then a probe or two.
		if stalls.Running(resumeAt, time.Now()) > openTimeout+3*time.Second {
			t.Fatalf("Redis has decided no check %v after the pause (breaker %s)", openTimeout+3*time.Second, r.PoolStates()[quota.DefaultPool])
		}
		time.Sleep(5 * time.Millisecond)
	}
	resumed := time.Since(resumeAt)
	time.Sleep(500 * time.Millisecond)
	recs := load.stop(t)

	// Fail-closed: every check is allowed by Redis or refused with ErrUnavailable.
	decided, refused, uncertain := 0, 0, 0
	for i, rec := range recs {
		switch {
		case rec.err == nil && rec.allowed && !rec.degraded:
			decided++
		case errors.Is(rec.err, quota.ErrUnavailable) && rec.degraded:
			refused++
			// A timed-out command may have run, unless it reached Redis paused and
			// its connection was closed before the pause ended: then Redis dropped
			// it. That holds for a timeout during the pause, 100 ms clear of its end
			// (for the close to reach Redis), in a process that did not stall (a
			// stall can time out a reply that came, then close late).
			if isTimeout(rec.err) && (rec.end().After(resumeAt.Add(-100*time.Millisecond)) ||
				rec.end().Before(pauseAt) || stalls.Within(rec.start, rec.end()) >= faultRedisTimeout/2) {
				uncertain++
			}
		default:
			t.Fatalf("check %d (at %v from the pause): %+v; want allowed by Redis or ErrUnavailable", i, rec.start.Sub(pauseAt), rec)
		}
	}
	// During the pause: every check answered by the fail mode, within the timeout.
	during := between(recs, paused, resumeAt)
	if len(during) < 100 {
		t.Fatalf("only %d checks during the pause: the load is too thin to mean anything", len(during))
	}
	for i, rec := range during {
		if !rec.degraded {
			t.Fatalf("check %d during the pause (at +%v) decided by Redis; want the fail mode's answer", i, rec.start.Sub(pauseAt))
		}
	}
	raw, ran := latencies(during), running(stalls, during)
	if bound := faultRedisTimeout + schedMargin; p99(ran) > bound {
		t.Errorf("p99 during the pause %v (%v with stalls), want <= %v (RedisTimeout %v + %v)", p99(ran), p99(raw), bound, faultRedisTimeout, schedMargin)
	}
	// The few checks sent to the paused Redis before the breaker opened: behind at
	// most one pipeline in flight, then their own timeout.
	if bound := 2*faultRedisTimeout + schedMargin; maxDur(ran) > bound {
		t.Errorf("slowest answer during the pause %v (%v with stalls), want <= %v (2 x RedisTimeout + %v)", maxDur(ran), maxDur(raw), bound, schedMargin)
	}
	// Service resumed: every check started once Redis decided again was decided,
	// unless a stall timed it out.
	after := between(recs, resumeAt.Add(resumed), time.Now())
	excused := 0
	for i, rec := range after {
		if rec.degraded {
			if stalledOver(stalls, rec, openTimeout) {
				excused++
				continue
			}
			t.Fatalf("check %d after the pause (at +%v) not decided: %+v", i, rec.start.Sub(resumeAt), rec)
		}
	}
	// No check counted twice, none lost: the warm-up check plus every allowed answer
	// Redis gave, plus at most the refusals whose command may have run (none unless
	// the process stalled across a reply).
	got := orgMonthCount(t, srv.raw, org)
	if low, high := int64(1+decided), int64(1+decided+uncertain); got < low || got > high {
		t.Errorf("org counter after the pause = %d, want %d (1 + %d allowed by Redis) plus at most %d timed out outside the pause; %d refused in all",
			got, low, decided, uncertain, refused)
	}
	longest, nstalls := stalls.Longest()
	t.Logf("pause %v: breaker open after %v; %d checks during it, all refused by the fail mode, p99 %v, max %v (raw: p99 %v, max %v); Redis decided again %v after the pause",
		pause, opened.Round(time.Millisecond), len(during), p99(ran).Round(10*time.Microsecond), maxDur(ran).Round(10*time.Microsecond),
		p99(raw).Round(10*time.Microsecond), maxDur(raw).Round(10*time.Microsecond), resumed.Round(time.Millisecond))
	t.Logf("counter %d = 1 warm-up + %d allowed by Redis (%d refusals whose command may have run); %d refused in all; %d checks after the pause, all decided (%d excused by stalls); process stalls: %d, longest %v",
		got, decided, uncertain, refused, len(after), excused, nstalls, longest.Round(time.Millisecond))
}
