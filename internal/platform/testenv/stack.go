package testenv

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// StackOptions says what a test's stack owns.
type StackOptions struct {
	// RedisDB is the database of the test Redis the stack's binaries use (1 to 15):
	// StartStack flushes it, and holds a Postgres advisory lock of that database's
	// until the test ends, so one run at a time uses it (the lead's make test and a
	// worktree's). Tests whose org ids are fixed (the demo org) cannot share a
	// keyspace with other tests: each such test picks a database of its own.
	RedisDB int
	// Env is more environment of both binaries ("QUOTA_WEBHOOK_ALLOW_PRIVATE=true"),
	// after (so over) the stack's own.
	Env []string
}

// Stack is a running quotaplane-api and quotaplane-worker, built from this checkout,
// on a fresh database with the demo org seeded as `make run` seeds it.
type Stack struct {
	APIAddr       string // host:port of the api, ready when StartStack returns
	GRPCAddr      string // host:port of the api's gRPC rate limit service
	WorkerAddr    string // host:port of the worker's /metrics and probes
	MetricsAddr   string // host:port of the api's /metrics (QUOTA_METRICS_ADDR)
	OperatorToken string // QUOTA_ADMIN_TOKEN
	DemoKey       string // the demo org's API key
	DatabaseURL   string
	RedisURL      string // database RedisDB of the test Redis
	APILog        *Buffer
	WorkerLog     *Buffer

	apiBin string   // the built quotaplane-api, for StartAPI
	env    []string // both binaries' environment
}

// Logs returns both binaries' output so far, for a failure message.
func (s *Stack) Logs() string {
	return fmt.Sprintf("api log:\n%s\nworker log:\n%s", s.APILog.String(), s.WorkerLog.String())
}

// stackLockBase plus the Redis database is the advisory lock a stack holds.
const stackLockBase = 7272000

// StartStack builds quotaplane-api and quotaplane-worker (once per test process),
// seeds the demo org (`quotaplane-api demo --state-dir`) on a fresh database, and
// starts both binaries on free ports with none of the developer's QUOTA_* settings,
// their output in APILog and WorkerLog. It returns once the api's /readyz answers
// 200; the binaries are stopped (SIGTERM) when the test ends. The package's TestMain
// must call Main, which removes the binaries.
func StartStack(tb testing.TB, opt StackOptions) *Stack {
	tb.Helper()
	if opt.RedisDB < 1 || opt.RedisDB > 15 {
		tb.Fatalf("testenv: StackOptions.RedisDB is %d: pick a database of its own, 1 to 15 (tests share the one of REDIS_URL)", opt.RedisDB)
	}
	dbURL := PostgresURL(tb)
	u, err := url.Parse(RedisURL(tb))
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Query().Get("cluster") != "" {
		tb.Skipf("testenv: the stack needs a plain redis:// URL to pick database %d: %q", opt.RedisDB, RedisURL(tb))
	}
	u.Path = "/" + strconv.Itoa(opt.RedisDB)
	apiBin, workerBin := binaries(tb)
	lockRedisDB(tb, dbURL, opt.RedisDB)
	flushRedisDB(tb, u.String(), opt.RedisDB)

	s := &Stack{
		APIAddr:       fmt.Sprintf("127.0.0.1:%d", FreePort(tb)),
		WorkerAddr:    fmt.Sprintf("127.0.0.1:%d", FreePort(tb)),
		GRPCAddr:      fmt.Sprintf("127.0.0.1:%d", FreePort(tb)),
		MetricsAddr:   fmt.Sprintf("127.0.0.1:%d", FreePort(tb)),
		OperatorToken: "stack-op-" + randHex(12),
		DatabaseURL:   dbURL,
		RedisURL:      u.String(),
		APILog:        &Buffer{},
		WorkerLog:     &Buffer{},
	}
	env := append(CleanEnviron(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+s.RedisURL,
		"QUOTA_ADMIN_TOKEN="+s.OperatorToken, "QUOTA_WEBHOOK_SECRET=stack-webhook-"+randHex(12),
		"QUOTA_HTTP_ADDR="+s.APIAddr, "QUOTA_WORKER_HTTP_ADDR="+s.WorkerAddr, "QUOTA_GRPC_ADDR="+s.GRPCAddr,
		"QUOTA_METRICS_ADDR="+s.MetricsAddr,
		"QUOTA_FLUSH_INTERVAL=200ms", "QUOTA_LOG_LEVEL=warn", "QUOTA_STARTUP_TIMEOUT=20s",
		// A machine busy with make test's -race builds can stall Redis past the 100 ms
		// default, and the demo plan fails open: the answer would say "degraded".
		"QUOTA_REDIS_TIMEOUT=2s")
	env = append(env, opt.Env...)
	s.apiBin, s.env = apiBin, env

	state := filepath.Join(tb.TempDir(), "state")
	seed := exec.Command(apiBin, "demo", "--state-dir", state)
	seed.Env = env
	if out, err := seed.CombinedOutput(); err != nil {
		tb.Fatalf("quotaplane-api demo: %v\n%s", err, out)
	}
	key, err := os.ReadFile(filepath.Join(state, "demo-org-key"))
	if err != nil {
		tb.Fatal(err)
	}
	s.DemoKey = strings.TrimSpace(string(key))

	startProcess(tb, workerBin, env, s.WorkerLog)
	startProcess(tb, apiBin, env, s.APILog)
	if err := waitReady(s.APIAddr, nil); err != nil {
		tb.Fatalf("testenv: %v\n%s", err, s.Logs())
	}
	return s
}

// waitReady waits until the api at addr answers /readyz 200 (60 s at most), or until
// exited is closed.
func waitReady(addr string, exited <-chan struct{}) error {
	const readyWithin = 60 * time.Second
	deadline := time.Now().Add(readyWithin)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		res, err := client.Get("http://" + addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/readyz answered %d", res.StatusCode)
		}
		select {
		case <-exited:
			return fmt.Errorf("the api at %s exited before it was ready: %v", addr, err)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the api at %s is not ready after %v: %v", addr, readyWithin, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	mainRan bool // Main runs the tests
	binOnce sync.Once
	binDir  string
	binErr  error
)

// Main runs a package's tests, then removes what testenv made for the whole test
// process (the binaries StartStack builds once), and exits. A package whose tests
// call StartStack has
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
func Main(m *testing.M) {
	mainRan = true
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// binaries returns quotaplane-api and quotaplane-worker built from this checkout,
// building them on the process's first call.
func binaries(tb testing.TB) (api, worker string) {
	tb.Helper()
	if !mainRan {
		tb.Fatal("testenv: StartStack builds the binaries once per test process and needs the package's TestMain to remove them: func TestMain(m *testing.M) { testenv.Main(m) }")
	}
	root := RepoRoot(tb)
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "quotaplane-stack-")
		if binErr != nil {
			return
		}
		for _, b := range []struct{ name, pkg string }{{"quotaplane-api", "./cmd/api"}, {"quotaplane-worker", "./cmd/worker"}} {
			build := exec.Command("go", "build", "-o", filepath.Join(binDir, b.name), b.pkg)
			build.Dir = root
			if out, err := build.CombinedOutput(); err != nil {
				binErr = fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
				return
			}
		}
	})
	if binErr != nil {
		tb.Fatalf("testenv: %v", binErr)
	}
	return filepath.Join(binDir, "quotaplane-api"), filepath.Join(binDir, "quotaplane-worker")
}

// CleanEnviron is the test's environment without the settings of the binaries, so a
// developer's QUOTA_REDIS_POOLS or REDIS_CLUSTER cannot reach the binaries under test
// (the stack's and the fault schedule's processes).
func CleanEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "QUOTA_") || name == "DATABASE_URL" || name == "REDIS_URL" || name == "REDIS_CLUSTER" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// startProcess runs a binary until the test ends, then stops it with SIGTERM (and
// kills it if it has not stopped 20 s later).
func startProcess(tb testing.TB, path string, env []string, log *Buffer) {
	tb.Helper()
	c := exec.Command(path)
	c.Env = env
	c.Stdout, c.Stderr = log, log
	if err := c.Start(); err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	tb.Cleanup(func() {
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	})
}

// lockRedisDB holds a Postgres advisory lock of Redis database db until the test
// ends. Advisory locks are per database: it takes it in the maintenance database
// of dbURL's server, which every test process shares.
func lockRedisDB(tb testing.TB, dbURL string, db int) {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	u.Path = "/postgres"
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(stackLockBase+db)); err != nil {
		tb.Fatal(err)
	}
}

// flushRedisDB empties database db at redisURL.
func flushRedisDB(tb testing.TB, redisURL string, db int) {
	tb.Helper()
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.FlushDB(context.Background()).Err(); err != nil {
		tb.Fatalf("flush Redis database %d: %v", db, err)
	}
}
