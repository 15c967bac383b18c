package testenv

import (
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// API is one more quotaplane-api process of a Stack (StartAPI): a replica on the
// stack's database and Redis, on an address of its own, that a test may kill -9 and
// start again on that address, as an orchestrator restarts a crashed pod.
type API struct {
	Addr        string  // host:port of its HTTP API
	MetricsAddr string  // host:port of its /metrics
	Log         *Buffer // its output, every run's

	tb   testing.TB
	bin  string
	env  []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when the running process has exited
}

// StartAPI starts another quotaplane-api of s with the stack's environment plus env
// (after it, so over it: "QUOTA_REPLICAS=2"), on free ports, and returns once its
// /readyz answers 200. It is stopped (SIGTERM) when the test ends if it still runs.
func (s *Stack) StartAPI(tb testing.TB, env ...string) *API {
	tb.Helper()
	a := &API{Addr: fmt.Sprintf("127.0.0.1:%d", FreePort(tb)), MetricsAddr: fmt.Sprintf("127.0.0.1:%d", FreePort(tb)),
		Log: &Buffer{}, tb: tb, bin: s.apiBin}
	a.env = append(append(append([]string{}, s.env...), env...),
		"QUOTA_HTTP_ADDR="+a.Addr, fmt.Sprintf("QUOTA_GRPC_ADDR=127.0.0.1:%d", FreePort(tb)), "QUOTA_METRICS_ADDR="+a.MetricsAddr)
	tb.Cleanup(a.stop)
	a.Start()
	return a
}

// Start starts the replica again after Kill, on the same address, and returns once
// its /readyz answers 200.
func (a *API) Start() {
	a.tb.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		a.tb.Fatalf("testenv: the api at %s is already running", a.Addr)
	}
	c := exec.Command(a.bin)
	c.Env = a.env
	c.Stdout, c.Stderr = a.Log, a.Log
	if err := c.Start(); err != nil {
		a.tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	a.cmd, a.done = c, done
	if err := waitReady(a.Addr, done); err != nil {
		a.tb.Fatalf("testenv: %v\n%s", err, a.Log.String())
	}
}

// PID is the process id of the running replica (0 when it is not running), for a
// test that reads its /proc/<pid>/status.
func (a *API) PID() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return 0
	}
	return a.cmd.Process.Pid
}

// Kill kills the replica with SIGKILL (kill -9: nothing it holds is settled) and
// waits until it has exited.
func (a *API) Kill() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGKILL)
	<-a.done
	a.cmd, a.done = nil, nil
}

// stop stops a running replica with SIGTERM (SIGKILL 20 s later).
func (a *API) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
	a.cmd, a.done = nil, nil
}
