package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// TestMain runs quotaplane-worker's main instead of the tests when asked to, so a
// test reads the real process's stderr, where go-redis and River would print.
func TestMain(m *testing.M) {
	if os.Getenv("QUOTAPLANE_TEST_MAIN") == "1" {
		os.Args = os.Args[:1]
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startMain starts this test binary as quotaplane-worker with env added to the test's
// environment; the process is killed when the test ends.
func startMain(t *testing.T, env map[string]string) (*exec.Cmd, *testenv.Buffer, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "QUOTAPLANE_TEST_MAIN=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}) // closed when it has exited; cmd.ProcessState says how
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	return cmd, &stderr, done
}

// While Redis is down the worker's flusher fails to read an org's counters every
// interval, and go-redis reports each failed dial: in JSON, like every other line.
func TestStderrIsJSONWhileRedisIsDown(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	svc := tenants.NewService(pool)
	if _, err := svc.CreatePlan(ctx, tenants.Actor{Name: "seed"}, tenants.PlanInput{ID: "p", Name: "P", FailMode: vocab.FailOpen}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.CreateOrg(ctx, tenants.Actor{Name: "seed"}, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "p"}); err != nil {
		t.Fatal(err)
	}
	cmd, stderr, done := startMain(t, map[string]string{"DATABASE_URL": dbURL,
		"REDIS_URL":              "redis://" + freeAddr(t) + "/0", // nothing listens there
		"QUOTA_WORKER_HTTP_ADDR": freeAddr(t), "QUOTA_FLUSH_INTERVAL": "100ms", "QUOTA_LOG_LEVEL": "debug"})
	deadline := time.After(60 * time.Second)
	for !strings.Contains(stderr.String(), "failed to dial") {
		select {
		case <-done:
			t.Fatalf("the worker stopped (%v); stderr:\n%s", cmd.ProcessState, stderr)
		case <-deadline:
			t.Fatalf("no failed dial reported within 60s; stderr:\n%s", stderr)
		case <-time.After(200 * time.Millisecond):
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the worker did not stop within 60s of SIGTERM; stderr:\n%s", stderr)
	}
	testenv.AssertJSONLines(t, stderr.String())
}

// A busy QUOTA_WORKER_HTTP_ADDR stops the worker at once, naming the variable.
func TestBusyAddressNamesTheVariable(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	cmd, stderr, done := startMain(t, map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"QUOTA_WORKER_HTTP_ADDR": busy.Addr().String()})
	select {
	case <-done:
		if code := cmd.ProcessState.ExitCode(); code != 1 {
			t.Errorf("exit status %d, want 1", code)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the worker still runs on a busy address; stderr:\n%s", stderr)
	}
	if want := "QUOTA_WORKER_HTTP_ADDR=" + busy.Addr().String(); !strings.Contains(stderr.String(), want) ||
		!strings.Contains(stderr.String(), "set QUOTA_WORKER_HTTP_ADDR to a free") {
		t.Errorf("stderr does not name %s and the fix:\n%s", want, stderr)
	}
	if strings.Contains(stderr.String(), `"msg":"worker running"`) {
		t.Errorf("logged running though it could not bind:\n%s", stderr)
	}
	testenv.AssertJSONLines(t, stderr.String())
}

// The clock fault hook: with QUOTA_FAULT_CLOCK=on, SIGUSR1 and SIGUSR2 step the
// engines' wall clock by +2 s and -2 s, logged as "clock stepped", and the worker runs
// on; without it no handler is installed (SIGUSR1 keeps Go's default: caught and
// ignored) and nothing is logged.
func TestFaultClockHook(t *testing.T) {
	dbURL := testenv.PostgresURL(t)
	for _, on := range []bool{true, false} {
		env := map[string]string{"DATABASE_URL": dbURL, "REDIS_URL": testenv.RedisURL(t), "QUOTA_WORKER_HTTP_ADDR": freeAddr(t)}
		if on {
			env["QUOTA_FAULT_CLOCK"] = "on"
		}
		cmd, stderr, done := startMain(t, env)
		wait := func(want string) {
			t.Helper()
			deadline := time.After(60 * time.Second)
			for !strings.Contains(stderr.String(), want) {
				select {
				case <-done:
					t.Fatalf("the worker stopped (%v) before logging %s; stderr:\n%s", cmd.ProcessState, want, stderr)
				case <-deadline:
					t.Fatalf("no %s within 60s; stderr:\n%s", want, stderr)
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		wait(`"msg":"worker running"`)
		if !on {
			resp, err := http.Get("http://" + env["QUOTA_WORKER_HTTP_ADDR"] + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(b), "go_build_info{") {
				t.Error("the worker's /metrics has no go_build_info (issue 26)")
			}
			// The counters its alerts read start at 0, so rate() sees the first
			// failure.
			for _, want := range []string{"\nquotaplane_worker_flush_errors_total 0\n", "\nquotaplane_worker_webhook_failures_total 0\n",
				"\nquotaplane_worker_webhook_deliveries_total 0\n"} {
				if !strings.Contains(string(b), want) {
					t.Errorf("the fresh worker's /metrics has no %q", strings.TrimSpace(want))
				}
			}
		}
		_ = cmd.Process.Signal(syscall.SIGUSR1)
		if !on {
			time.Sleep(500 * time.Millisecond)
			if out := stderr.String(); strings.Contains(out, "clock stepped") || strings.Contains(out, "clock fault hook") {
				t.Errorf("the hook logged without QUOTA_FAULT_CLOCK:\n%s", out)
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-done
			continue
		}
		wait(`"msg":"clock stepped","by":"2s","step":"2s"`)
		_ = cmd.Process.Signal(syscall.SIGUSR2) // one at a time: a signal pending twice is delivered once
		wait(`"step":"0s"`)
		_ = cmd.Process.Signal(syscall.SIGUSR2)
		wait(`"msg":"clock stepped","by":"-2s","step":"-2s"`)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			if code := cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("exit status %d after SIGTERM, want 0; stderr:\n%s", code, stderr)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("the worker did not stop within 60s of SIGTERM; stderr:\n%s", stderr)
		}
		testenv.AssertJSONLines(t, stderr.String())
	}
}
