package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// TestMain runs quotaplane-api's main instead of the tests when asked to, so a test
// reads the real process's stderr: what go-redis or a failed start prints there
// bypasses any writer handed to run.
func TestMain(m *testing.M) {
	if os.Getenv("QUOTAPLANE_TEST_MAIN") == "1" {
		os.Args = os.Args[:1] // no -test flags: they would be the api's arguments
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// startMain starts this test binary as quotaplane-api with env added to the test's
// own environment; the process is killed when the test ends.
func startMain(t *testing.T, env map[string]string) (*exec.Cmd, *testenv.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// Any free port for the gRPC listener, unless env names one: tests run at once.
	cmd.Env = append(os.Environ(), "QUOTAPLANE_TEST_MAIN=1", "QUOTA_GRPC_ADDR=127.0.0.1:0")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr testenv.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, &stderr
}

// While Redis is down, go-redis reports every failed dial itself. Those reports,
// like every other line, must be JSON on stderr, not go-redis's own plain lines.
func TestStderrIsJSONWhileRedisIsDown(t *testing.T) {
	addr := freeAddr(t)
	cmd, stderr := startMain(t, map[string]string{"DATABASE_URL": testenv.PostgresURL(t),
		"REDIS_URL":       "redis://" + freeAddr(t) + "/0", // nothing listens there
		"QUOTA_HTTP_ADDR": addr, "QUOTA_ADMIN_TOKEN": "a-test-operator-token"})
	// /readyz pings Redis; wait until go-redis has reported a failed dial.
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), "failed to dial") {
		if time.Now().After(deadline) {
			t.Fatalf("no failed dial reported within 30s; stderr:\n%s", stderr)
		}
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			resp.Body.Close()
		}
		time.Sleep(200 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	testenv.AssertJSONLines(t, stderr.String())
}

// A busy QUOTA_HTTP_ADDR stops the api at once, saying which variable to change, in
// a JSON line like the others.
func TestBusyAddressNamesTheVariable(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, key := range []string{"QUOTA_HTTP_ADDR", "QUOTA_PPROF_ADDR", "QUOTA_GRPC_ADDR", "QUOTA_METRICS_ADDR"} {
		t.Run(key, func(t *testing.T) {
			env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
				"QUOTA_HTTP_ADDR": freeAddr(t), "QUOTA_ADMIN_TOKEN": "a-test-operator-token"}
			env[key] = busy.Addr().String()
			cmd, stderr := startMain(t, env)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 1 {
					t.Errorf("exit: %v, want status 1", err)
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("the api still runs on a busy %s; stderr:\n%s", key, stderr)
			}
			if want := key + "=" + busy.Addr().String(); !strings.Contains(stderr.String(), want) ||
				!strings.Contains(stderr.String(), "set "+key+" to a free") {
				t.Errorf("stderr does not name %s and the fix:\n%s", want, stderr)
			}
			if strings.Contains(stderr.String(), `"msg":"listening"`) {
				t.Errorf("logged listening though it could not bind:\n%s", stderr)
			}
			testenv.AssertJSONLines(t, stderr.String())
		})
	}
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

// The api starts on an empty database, serves HTTP and gRPC (whose health service
// answers SERVING), and stops both cleanly when its context ends (what SIGTERM does
// through signal.NotifyContext).
func TestRunServesAndShutsDownGracefully(t *testing.T) {
	addr, grpcAddr, metricsAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"QUOTA_HTTP_ADDR": addr, "QUOTA_GRPC_ADDR": grpcAddr, "QUOTA_ADMIN_TOKEN": "a-test-operator-token", "QUOTA_LOG_LEVEL": "error",
		"QUOTA_METRICS_ADDR": metricsAddr}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }, &bytes.Buffer{}, io.Discard) }()

	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("api not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if body := get(t, "http://"+metricsAddr+"/metrics"); !strings.Contains(body, "go_build_info{") {
		t.Error("/metrics has no go_build_info (issue 26: which build each replica runs)")
	}
	// The metrics name orgs and their traffic; the public listener does not serve them
	// unless QUOTA_METRICS_ADDR=public.
	if resp, err := http.Get("http://" + addr + "/metrics"); err != nil || resp.StatusCode != http.StatusNotFound ||
		resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("/metrics on the public listener: %v %v, want a 404 problem", resp, err)
	} else {
		resp.Body.Close()
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		res, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("gRPC health of %q = %v, %v; want SERVING", svc, res.GetStatus(), err)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v after shutdown", err)
		}
		if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err == nil {
			t.Error("the gRPC server still answers after shutdown")
		}
	case <-time.After(25 * time.Second):
		t.Fatal("api did not stop")
	}
}

func TestRunRejectsBadConfigListingEveryProblem(t *testing.T) {
	env := map[string]string{"QUOTA_HTTP_ADDR": "8080", "QUOTA_ADMIN_TOKEN": "short"}
	err := run(context.Background(), nil, func(k string) string { return env[k] }, &bytes.Buffer{}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "QUOTA_HTTP_ADDR") || !strings.Contains(err.Error(), "QUOTA_ADMIN_TOKEN") {
		t.Fatalf("err = %v", err)
	}
}

// get returns url's body, failing unless it answers 200.
func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(b)
}

// The demo's printed URLs can be opened: a wildcard listen address prints loopback.
func TestReachableURL(t *testing.T) {
	for addr, want := range map[string]string{
		"0.0.0.0:8080": "http://127.0.0.1:8080", "[::]:8080": "http://127.0.0.1:8080", ":8080": "http://127.0.0.1:8080",
		"127.0.0.1:8080": "http://127.0.0.1:8080", "10.1.2.3:9000": "http://10.1.2.3:9000", "[::1]:8080": "http://[::1]:8080",
		"api.internal:80": "http://api.internal:80",
	} {
		if got := reachableURL(addr); got != want {
			t.Errorf("reachableURL(%q) = %q, want %q", addr, got, want)
		}
	}
}

// The docker-compose seed (demo --hide-secrets) prints where the demo key and console
// password are kept and how to read them, never them or the operator token: a
// service's output stays in docker compose's logs.
func TestDemoSeedHidesSecrets(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "QUOTA_ADMIN_TOKEN": "a-test-operator-token", "QUOTA_LOG_LEVEL": "error"}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"demo", "--state-dir", dir, "--hide-secrets"}, func(k string) string { return env[k] }, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(dir + "/demo-org-key")
	if err != nil || len(key) == 0 {
		t.Fatalf("the demo key was not kept in the state dir: %v", err)
	}
	pw, err := os.ReadFile(dir + "/demo-console-password")
	if err != nil || len(pw) == 0 {
		t.Fatalf("the console password was not kept in the state dir: %v", err)
	}
	for name, secret := range map[string]string{"demo key": string(key), "console password": string(pw), "operator token": env["QUOTA_ADMIN_TOKEN"]} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("the seed printed the %s:\n%s", name, out.String())
		}
	}
	if !strings.Contains(out.String(), `docker cp "$(docker compose ps -aq seed)":`+dir+"/demo-org-key") {
		t.Errorf("the seed does not say how to read the key:\n%s", out.String())
	}
	// without the flag (make run) it prints them, as before
	out.Reset()
	if err := run(context.Background(), []string{"demo", "--state-dir", dir}, func(k string) string { return env[k] }, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), string(key)) {
		t.Errorf("make run's seed no longer prints the key:\n%s", out.String())
	}
}
