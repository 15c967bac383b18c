package ledger_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// privateRedis is a redis-server of the test's own, without persistence, that the
// test may kill -9 and restart on the same port.
type privateRedis struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
}

func startPrivateRedis(t testing.TB) *privateRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	r := &privateRedis{t: t, port: port}
	r.start()
	t.Cleanup(func() {
		if r.cmd != nil && r.cmd.Process != nil {
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
		}
	})
	return r
}

func (r *privateRedis) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

func (r *privateRedis) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--protected-mode", "no")
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), MaxRetries: -1})
	defer c.Close()
	waitFor(r.t, 10*time.Second, "private redis-server to answer", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
}

// kill9 sends SIGKILL: no shutdown, no save.
func (r *privateRedis) kill9() {
	r.t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		r.t.Fatal(err)
	}
	_ = r.cmd.Wait()
	r.cmd = nil
}

// The first "Done when": a Redis without persistence is killed -9 and restarted.
// With no traffic in the last flush interval every user's remaining quota is exactly
// what it was; killed mid-traffic, each user loses at most the checks admitted within
// one flush interval before the kill; and after the restart no check is decided on an
// empty counter (the first one of every user already sees the stored usage).
func TestKill9RedisRestoresUsageWithinOneFlushInterval(t *testing.T) {
	const (
		interval = 300 * time.Millisecond
		users    = 16
		limit    = 1_000_000
	)
	e := newEnv(t)
	ctx := context.Background()
	rs := startPrivateRedis(t)
	eng, _ := e.NewEngine(rs.url())
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 100*limit)}, nil,
		tenants.TeamInput{ID: "eng", UserLimits: []vocab.Limit{monthLimit("requests", limit)}})
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc,
		Counters: oneEngine(eng), Interval: interval, Logger: quietLog()})
	fctx, stopFlusher := context.WithCancel(ctx)
	flushDone := make(chan struct{})
	go func() { f.Run(fctx); close(flushDone) }()
	defer func() { stopFlusher(); <-flushDone }()

	user := func(i int) string { return fmt.Sprintf("user-%02d", i) }
	// used reads each user's month usage with a cost-0 check; it fails on any error.
	used := func() [users]int64 {
		var out [users]int64
		for i := range users {
			res, err := e.Check(eng, org, "eng", user(i), "requests", 0)
			if err != nil {
				t.Fatalf("read %s: %v", user(i), err)
			}
			for _, l := range res.Levels {
				if l.Level == vocab.LevelUser {
					out[i] = l.Used
				}
			}
		}
		return out
	}

	// traffic runs checks of every user until stop, recording when each was admitted.
	var mu sync.Mutex
	admitted := make([][]time.Time, users)
	var failed atomic.Int64
	traffic := func(stop <-chan struct{}) *sync.WaitGroup {
		var wg sync.WaitGroup
		for i := range users {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					res, err := e.Check(eng, org, "eng", user(i), "requests", 1)
					if err != nil {
						failed.Add(1)
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if res.Allowed {
						mu.Lock()
						admitted[i] = append(admitted[i], time.Now())
						mu.Unlock()
					}
				}
			}()
		}
		return &wg
	}

	// Phase 1: traffic, then quiet for more than one flush interval, then kill -9.
	stop := make(chan struct{})
	wg := traffic(stop)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	time.Sleep(2*interval + 100*time.Millisecond)
	before := used()
	rs.kill9()
	rs.start()
	after := used()
	if before != after {
		t.Fatalf("quiet kill -9: usage changed\nbefore %v\nafter  %v", before, after)
	}
	var total int64
	for _, v := range before {
		total += v
	}
	if total == 0 {
		t.Fatal("no traffic was admitted")
	}
	t.Logf("phase 1 (quiet last interval): %d units over %d users restored exactly", total, users)

	// Phase 2: kill -9 in the middle of traffic.
	for i := range admitted {
		admitted[i] = nil
	}
	base := used()
	stop = make(chan struct{})
	wg = traffic(stop)
	time.Sleep(1500 * time.Millisecond)
	killedAt := time.Now()
	rs.kill9()
	time.Sleep(200 * time.Millisecond) // checks fail meanwhile
	close(stop)
	wg.Wait()
	rs.start()
	// The first check of every user after the restart must see the stored usage.
	var firstAfter [users]int64
	for i := range users {
		res, err := e.Check(eng, org, "eng", user(i), "requests", 0)
		if err != nil {
			t.Fatalf("first check after restart: %v", err)
		}
		for _, l := range res.Levels {
			if l.Level == vocab.LevelUser {
				firstAfter[i] = l.Used
			}
		}
	}

	var maxLoss, totalLoss, totalAdmitted int64
	minBound := int64(1 << 62)
	for i := range users {
		mu.Lock()
		var beforeKill, lastInterval int64
		for _, at := range admitted[i] {
			beforeKill++ // nothing is admitted while Redis is dead
			// one interval, plus the time a flush takes to drain and write
			if at.After(killedAt.Add(-interval - 150*time.Millisecond)) {
				lastInterval++
			}
		}
		mu.Unlock()
		want := base[i] + beforeKill
		loss := want - firstAfter[i]
		if firstAfter[i] == 0 {
			t.Fatalf("%s: first check after the restart saw an empty counter", user(i))
		}
		if loss < 0 || loss > lastInterval {
			t.Errorf("%s: had %d before the kill, %d after: lost %d, more than the %d admitted in the last flush interval",
				user(i), want, firstAfter[i], loss, lastInterval)
		}
		maxLoss = max(maxLoss, loss)
		minBound = min(minBound, lastInterval)
		totalLoss += loss
		totalAdmitted += beforeKill
	}
	t.Logf("phase 2 (kill -9 mid-traffic, flush every %s): %d checks admitted in 1.5 s, %d units lost in total, at most %d per user "+
		"(allowed: the checks of the last interval, at least %d per user); %d checks failed while Redis was down; no check saw an empty counter",
		interval, totalAdmitted, totalLoss, maxLoss, minBound, failed.Load())
}
