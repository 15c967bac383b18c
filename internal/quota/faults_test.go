package quota_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	ctx := context.Background()
	org, org2 := testenv.ID(t, "org"), testenv.ID(t, "org")
	req := func(org, key string, monthLimit int64) quota.Request {
		return quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: 1, IdempotencyKey: key,
			Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Month, monthLimit)}}}
	}
	steps := []struct {
		name      string
		req       quota.Request
		allowed   bool
		replayed  bool
		used      int64 // reported at the user's month limit
		wantCount int64 // user counter afterwards
	}{
		{name: "first use counts", req: req(org, "key-aaaaaaaa", 2), allowed: true, used: 1, wantCount: 1},
		{name: "repeat replays and consumes nothing", req: req(org, "key-aaaaaaaa", 2), allowed: true, replayed: true, used: 1, wantCount: 1},
		{name: "another key counts", req: req(org, "key-bbbbbbbb", 2), allowed: true, used: 2, wantCount: 2},
		{name: "a denial counts nothing", req: req(org, "key-cccccccc", 2), used: 2, wantCount: 2},
		// a denial stores no record (it counted nothing, so deciding it again is
		// harmless): its retry is decided anew, and counts once
		{name: "a denied key's retry is decided anew", req: req(org, "key-cccccccc", 10), allowed: true, used: 3, wantCount: 3},
		{name: "and then replays", req: req(org, "key-cccccccc", 10), allowed: true, replayed: true, used: 3, wantCount: 3},
		{name: "replay of the first decision is unchanged", req: req(org, "key-aaaaaaaa", 10), allowed: true, replayed: true, used: 1, wantCount: 3},
		{name: "keys are per org", req: req(org2, "key-aaaaaaaa", 2), allowed: true, used: 1, wantCount: 3},
	}
	for _, s := range steps {
		res := r.MustCheck(t, s.req)
		got := struct {
			Allowed, Replayed bool
			Used              int64
		}{res.Allowed, res.Replayed, res.Levels[0].Used}
		want := struct {
			Allowed, Replayed bool
			Used              int64
		}{s.allowed, s.replayed, s.used}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.name, diff)
		}
		if n := r.usage(t, org)[userC("requests", "eng", "alice")]; n != s.wantCount {
			t.Errorf("%s: user counter %d, want %d", s.name, n, s.wantCount)
		}
	}

	// The same key twice in one pipeline: the second is a replay.
	org3 := testenv.ID(t, "org")
	r.MustCheck(t, quota.Request{Org: org3, Metric: "requests"}) // hydrate first
	results, errs := r.e.CheckBatch(ctx, []quota.Request{req(org3, "key-dddddddd", 5), req(org3, "key-dddddddd", 5)})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if results[0].Replayed || !results[1].Replayed || r.usage(t, org3)[orgC("requests")] != 1 {
		t.Errorf("duplicate key in one batch: replayed %v/%v, org counter %d; want false/true, 1",
			results[0].Replayed, results[1].Replayed, r.usage(t, org3)[orgC("requests")])
	}
}

// dropProxy forwards TCP to Redis. Between dropReplies and passReplies it swallows
// Redis's replies on the connections open when dropping began: the requests execute,
// their replies are lost. Connections opened meanwhile pass, as after a network blip.
type dropProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	live   map[*atomic.Bool]bool // drop flag of each open connection
}

func (p *dropProxy) dropReplies() { p.setDrop(true) }
func (p *dropProxy) passReplies() { p.setDrop(false) }

func (p *dropProxy) setDrop(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for f := range p.live {
		f.Store(v)
	}
}

func startProxy(tb testing.TB, target string) *dropProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &dropProxy{ln: ln, target: target, live: map[*atomic.Bool]bool{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	tb.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			_ = c.Close()
		}
	})
	return p
}

func (p *dropProxy) serve(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = c.Close()
		return
	}
	drop := new(atomic.Bool)
	p.mu.Lock()
	p.conns = append(p.conns, c, u)
	p.live[drop] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.live, drop)
		p.mu.Unlock()
	}()
	go func() {
		_, _ = io.Copy(u, c)
		_ = u.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if n > 0 && !drop.Load() {
			if _, werr := c.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = c.Close()
}

func TestLostReplyCountedOnce(t *testing.T) {
	t.Parallel()
	direct := testenv.Redis(t)
	target := direct.Options().Addr
	proxy := startProxy(t, target)
	opt, err := quota.ClientOptions(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.Addr = proxy.ln.Addr().String()
	opt.ReadTimeout = 300 * time.Millisecond
	r := MustRigOptions(t, opt, quota.Config{})
	ctx := context.Background()
	org := testenv.ID(t, "org")
	req := quota.Request{Org: org, Metric: "requests", Cost: 1, Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 100)}}}
	r.MustCheck(t, req)

	proxy.dropReplies()
	_, err = r.e.Check(ctx, req)
	proxy.passReplies()
	if !errors.Is(err, quota.ErrUnavailable) {
		t.Fatalf("check behind a lost reply: err = %v, want ErrUnavailable", err)
	}
	monthKey := r.prefix + ":{" + org + "}|m|" + r.e.Period(1).ID
	if got := direct.HGet(ctx, monthKey, "requests|o").Val(); got != "2" {
		t.Errorf("org counter after a lost reply = %s, want 2 (the lost check counted exactly once)", got)
	}
	if res := r.MustCheck(t, req); !res.Allowed || res.Levels[0].Used != 3 {
		t.Errorf("check after the lost reply: %+v, want allowed with 3 used", res)
	}

	t.Run("a retrying client counts it twice, silently", func(t *testing.T) {
		// Why New refuses such clients: go-redis re-sends a command whose reply timed
		// out, on a fresh connection, and reports success.
		opt := *opt
		opt.MaxRetries = 0 // the default, 3 retries
		rc := redis.NewClient(&opt)
		defer rc.Close()
		key := r.prefix + ":retry-demo"
		if err := rc.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		proxy.dropReplies()
		err := rc.Incr(ctx, key).Err()
		proxy.passReplies()
		if got := direct.Get(ctx, key).Val(); err != nil || got != "2" {
			t.Errorf("INCR behind one lost reply: err %v, counted %q times; want no error and 2", err, got)
		}
		if _, err := quota.New(rc, quota.Config{}); !errors.Is(err, quota.ErrRetryingClient) {
			t.Errorf("New with a retrying client = %v, want ErrRetryingClient", err)
		}
	})
}

func TestClockSkewDecidesIdentically(t *testing.T) {
	t.Parallel()
	slow := func() time.Time { return time.Now().Add(-40 * 24 * time.Hour) } // another period
	fast := func() time.Time { return time.Now().Add(7 * time.Minute) }
	r1 := MustRig(t, "", quota.Config{Clock: slow})
	r2 := MustRig(t, "", quota.Config{Clock: fast, KeyPrefix: r1.prefix})
	if d := r1.e.Now().Sub(r2.e.Now()).Abs(); d > time.Second {
		t.Errorf("corrected clocks differ by %v", d)
	}
	if p1, p2 := r1.e.Period(1), r2.e.Period(1); p1 != p2 {
		t.Errorf("periods differ: %+v vs %+v", p1, p2)
	}
	if vocab.PeriodAt(slow(), 1).ID == r1.e.Period(1).ID {
		t.Fatal("test is void: the skewed clock alone gives the same period")
	}
	org := testenv.ID(t, "org")
	req := quota.Request{Org: org, Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 10), lim(vocab.Hour, 12)}}}
	var got []bool
	for i := range 14 {
		e := r1.e
		if i%2 == 1 {
			e = r2.e
		}
		res, err := e.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, res.Allowed)
	}
	want := []bool{true, true, true, true, true, true, true, true, true, true, false, false, false, false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decisions alternating between skewed engines (-want +got):\n%s", diff)
	}
	req.Cost = 0
	a, b := r1.MustCheck(t, req), r2.MustCheck(t, req)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("the same query through both engines differs (-r1 +r2):\n%s", diff)
	}
}

func TestNoScriptAfterFlush(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	ctx := context.Background()
	org := testenv.ID(t, "org")
	req := quota.Request{Org: org, Team: "eng", Metric: "requests", Cost: 1}
	r.MustCheck(t, req)

	// SCRIPT FLUSH on the shared Redis: other tests only see a reload, which is what
	// this test is about.
	if err := r.raw.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			if _, err := r.e.Check(ctx, req); err != nil {
				t.Errorf("check after SCRIPT FLUSH: %v", err)
			}
		})
	}
	wg.Wait()
	if err := r.raw.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	reqs := make([]quota.Request, 10)
	for i := range reqs {
		reqs[i] = req
	}
	_, errs := r.e.CheckBatch(ctx, reqs)
	if err := errors.Join(errs...); err != nil {
		t.Errorf("batch after SCRIPT FLUSH: %v", err)
	}
	if got := r.usage(t, org)[orgC("requests")]; got != 43 {
		t.Errorf("org counter = %d, want 43: every check counted exactly once", got)
	}
}

// redisServer is a private redis-server process of a test.
type redisServer struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process is gone
}

// Kill stops the server abruptly (SIGKILL), as a crash would, and returns once it is gone.
func (s *redisServer) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// startRedisServer runs a private redis-server on port until the test ends, and fails
// the test when it does not answer within 15 s, with what redis-server said.
func startRedisServer(tb testing.TB, port int) *redisServer {
	tb.Helper()
	cmd, err := tryRedisServer(tb, port, 15*time.Second)
	if err != nil {
		tb.Fatal(err)
	}
	return cmd
}

// startRedisServerAnyPort is startRedisServer on a free port, tried again on another
// port when redis-server cannot bind the one it was given: a free port may be taken by
// another test between testenv.FreePort and redis-server's bind.
func startRedisServerAnyPort(tb testing.TB) (*redisServer, int) {
	tb.Helper()
	var errs []error
	for range 3 {
		port := testenv.FreePort(tb)
		cmd, err := tryRedisServer(tb, port, 15*time.Second)
		if err == nil {
			return cmd, port
		}
		errs = append(errs, err)
	}
	tb.Fatal(errors.Join(errs...))
	return nil, 0
}

// tryRedisServer starts redis-server on port and waits up to wait for it to answer.
// It is killed when the test ends.
func tryRedisServer(tb testing.TB, port int, wait time.Duration) (*redisServer, error) {
	tb.Helper()
	// Its output goes to a file, not a buffer: exec would copy into a buffer on a
	// goroutine of its own, which the outage tests would count as the check path's.
	out, err := os.CreateTemp(tb.TempDir(), "redis-server-*.log")
	if err != nil {
		tb.Fatal(err)
	}
	defer out.Close()
	said := func() string { b, _ := os.ReadFile(out.Name()); return string(b) }
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		tb.Skipf("redis-server not available: %v", err)
	}
	srv := &redisServer{cmd: cmd, exited: make(chan struct{})}
	go func() {
		pprof.SetGoroutineLabels(context.Background()) // not one of the test's labelled goroutines
		_ = cmd.Wait()
		close(srv.exited)
	}()
	tb.Cleanup(srv.Kill)
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(wait); ; {
		select {
		case <-srv.exited:
			return nil, fmt.Errorf("redis-server on port %d exited at start: %s", port, said())
		default:
		}
		if c.Ping(context.Background()).Err() == nil {
			return srv, nil
		}
		if time.Now().After(deadline) {
			srv.Kill()
			return nil, fmt.Errorf("redis-server on port %d did not answer within %s: %s", port, wait, said())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRedisRestart(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	srv := startRedisServer(t, port)
	r := MustRig(t, fmt.Sprintf("redis://127.0.0.1:%d/0", port), quota.Config{})
	ctx := context.Background()
	org := testenv.ID(t, "org")
	req := quota.Request{Org: org, Team: "eng", User: "u", Metric: "requests", Cost: 1,
		Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Minute, 100)}}}
	for range 3 {
		r.MustCheck(t, req)
	}

	srv.Kill()
	if _, err := r.e.Check(ctx, req); !errors.Is(err, quota.ErrUnavailable) {
		t.Errorf("check while Redis is down: err = %v, want ErrUnavailable", err)
	}

	startRedisServer(t, port)
	// Redis came back empty: no script, no counters, no period marker. The next
	// check must succeed without a client-visible error.
	res, err := r.e.Check(ctx, req)
	if err != nil {
		t.Fatalf("first check after the restart: %v", err)
	}
	if !res.Allowed || len(res.Levels) != 1 || res.Levels[0].Used != 1 {
		t.Errorf("first check after the restart: %+v, want allowed with 1 used", res)
	}
	if n := r.usage(t, org)[orgC("requests")]; n != 1 {
		t.Errorf("org counter after restart = %d, want 1", n)
	}
}

func TestCloseAndCancel(t *testing.T) {
	// Not parallel: counts goroutines.
	ctx := context.Background()
	before := runtime.NumGoroutine()
	opt, err := quota.ClientOptions(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	prefix := testenv.ID(t, "qt")
	e, err := quota.New(rdb, quota.Config{KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	org := testenv.ID(t, "org")
	req := quota.Request{Org: org, Metric: "requests", Cost: 1}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Check(cctx, req); !errors.Is(err, context.Canceled) {
		t.Errorf("Check with a cancelled context = %v, want context.Canceled", err)
	}
	if n := rdb.Exists(ctx, prefix+":{"+org+"}|m|"+e.Period(1).ID).Val(); n != 0 {
		t.Errorf("a cancelled check left counters behind")
	}

	// Checks in flight while Close runs either finish or fail with ErrClosed.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 50 {
				if _, err := e.Check(ctx, req); err != nil {
					if !errors.Is(err, quota.ErrClosed) {
						t.Errorf("check during Close: %v", err)
					}
					return
				}
			}
		})
	}
	time.Sleep(5 * time.Millisecond)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if _, err := e.Check(ctx, req); !errors.Is(err, quota.ErrClosed) {
		t.Errorf("Check after Close = %v, want ErrClosed", err)
	}
	if _, errs := e.CheckBatch(ctx, []quota.Request{req}); !errors.Is(errs[0], quota.ErrClosed) {
		t.Errorf("CheckBatch after Close = %v, want ErrClosed", errs[0])
	}
	_ = e.Close() // idempotent
	iter := rdb.Scan(ctx, 0, prefix+":*", 100).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
	_ = rdb.Close()
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines: %d before, %d after Close\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// A would-block batch whose reply is lost ran in Redis; the engine sends it again
// unchanged, and the script applies its sequence number once: counted exactly once.
func TestWouldBlockLostReplyCountedOnce(t *testing.T) {
	t.Parallel()
	proxy := startProxy(t, testenv.Redis(t).Options().Addr)
	opt, err := quota.ClientOptions(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.Addr = proxy.ln.Addr().String()
	opt.ReadTimeout = 300 * time.Millisecond
	r := MustRigOptions(t, opt, quota.Config{WouldBlockFlush: time.Hour})
	ctx := context.Background()
	org := testenv.ID(t, "org")
	over := func() {
		r.MustCheck(t, quota.Request{Org: org, Metric: "requests", Cost: 2, Mode: vocab.Shadow,
			Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1)}}})
	}
	over()
	mustRecord(t, r, org) // the script is loaded: the lost batch below runs
	over()
	over()
	proxy.dropReplies()
	err = r.e.FlushWouldBlock(ctx)
	proxy.passReplies()
	if !errors.Is(err, quota.ErrUnavailable) {
		t.Fatalf("flush behind a lost reply: err = %v, want ErrUnavailable", err)
	}
	over() // counted while the lost batch waits: it goes in the next batch
	rec := mustRecord(t, r, org)
	if got := byRow(rec)[wbRow{Metric: "requests", Level: vocab.LevelOrg, Window: vocab.Month}]; got != (quota.WouldBlockCount{Checks: 4, Units: 8}) {
		t.Errorf("record after a lost reply and a re-send: %+v, want 4 checks of 8 units", got)
	}
}
