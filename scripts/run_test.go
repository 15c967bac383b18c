// Package scripts_test tests how a newcomer starts Quotaplane: scripts/run.sh, the
// script behind `make run`, must fail loudly and at once when the api or the worker
// cannot run, and otherwise serve with the demo's keys printed; docker-compose.yml
// must not start with a known secret or publish the api to the network.
package scripts_test

import (
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// limit bounds each wait on run.sh, which builds both binaries first: a hang fails
// the test instead of blocking the suite.
const limit = 3 * time.Minute

var binDir string // the binaries run.sh builds, shared by the tests of one run

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "quotaplane-run-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

type run struct {
	cmd    *exec.Cmd
	out    *testenv.Buffer
	done   chan struct{}
	err    error
	api    string // QUOTA_HTTP_ADDR
	worker string // QUOTA_WORKER_HTTP_ADDR
}

func freeAddr(t *testing.T) string {
	return "127.0.0.1:" + strconv.Itoa(testenv.FreePort(t))
}

// start runs scripts/run.sh on a fresh database, free ports and a throwaway state
// directory, with env on top; its process group is stopped when the test ends.
func start(t *testing.T, env map[string]string) *run {
	t.Helper()
	r := &run{out: &testenv.Buffer{}, done: make(chan struct{}), api: freeAddr(t), worker: freeAddr(t)}
	vars := map[string]string{
		"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"QUOTA_HTTP_ADDR": r.api, "QUOTA_WORKER_HTTP_ADDR": r.worker, "QUOTA_GRPC_ADDR": freeAddr(t),
		"QUOTA_STATE_DIR": t.TempDir(), "QUOTA_BIN_DIR": binDir,
		"QUOTA_ADMIN_TOKEN": "", "QUOTA_WEBHOOK_SECRET": "", "QUOTA_PPROF_ADDR": "",
	}
	for k, v := range env {
		vars[k] = v
	}
	r.api, r.worker = vars["QUOTA_HTTP_ADDR"], vars["QUOTA_WORKER_HTTP_ADDR"]
	r.cmd = exec.Command("bash", "scripts/run.sh")
	r.cmd.Dir = ".."
	r.cmd.Env = os.Environ()
	for k, v := range vars {
		r.cmd.Env = append(r.cmd.Env, k+"="+v)
	}
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.err = r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
		}
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	})
	return r
}

// exit waits for run.sh to end and returns its exit status.
func (r *run) exit(t *testing.T) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(limit):
		t.Fatalf("run.sh still runs after %s; output:\n%s", limit, r.out)
	}
	var exit *exec.ExitError
	if r.err != nil && !errors.As(r.err, &exit) {
		t.Fatalf("run.sh: %v", r.err)
	}
	return r.cmd.ProcessState.ExitCode()
}

func busy(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

func TestRunStopsWhenTheAPIPortIsBusy(t *testing.T) {
	r := start(t, map[string]string{"QUOTA_HTTP_ADDR": busy(t)})
	if code := r.exit(t); code == 0 {
		t.Errorf("exit status 0 with a busy api port; output:\n%s", r.out)
	}
	out := r.out.String()
	if !strings.Contains(out, "QUOTA_HTTP_ADDR="+r.api) || !strings.Contains(out, "The api stopped") {
		t.Errorf("the output does not name QUOTA_HTTP_ADDR=%s and the api:\n%s", r.api, out)
	}
}

func TestRunStopsWhenTheWorkerPortIsBusy(t *testing.T) {
	r := start(t, map[string]string{"QUOTA_WORKER_HTTP_ADDR": busy(t)})
	if code := r.exit(t); code == 0 {
		t.Errorf("exit status 0 with a busy worker port; output:\n%s", r.out)
	}
	out := r.out.String()
	if !strings.Contains(out, "QUOTA_WORKER_HTTP_ADDR="+r.worker) || !strings.Contains(out, "The worker stopped") {
		t.Errorf("the output does not name QUOTA_WORKER_HTTP_ADDR=%s and the worker:\n%s", r.worker, out)
	}
	if strings.Contains(out, "Worker started") {
		t.Errorf("said the worker started though it could not:\n%s", out)
	}
}

// The healthy run prints the demo's keys and serves; a worker that dies later stops
// the whole run, since nothing would be persisted without it.
func TestRunServesThenStopsWhenTheWorkerDies(t *testing.T) {
	r := start(t, nil)
	deadline := time.Now().Add(limit)
	for {
		resp, err := http.Get("http://" + r.api + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-r.done:
			t.Fatalf("run.sh stopped (%v) before the api served; output:\n%s", r.err, r.out)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the api did not serve /healthz within %s; output:\n%s", limit, r.out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	out := r.out.String()
	for _, want := range []string{"Operator token:  ", "Demo org key:    qpk_", "Console:", "Worker started"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "QUOTA_WEBHOOK_ALLOW_PRIVATE") && !strings.Contains(out, `"webhook_allow_private":true`) {
		t.Errorf("the worker does not allow private webhook targets in a local run:\n%s", out)
	}

	// The worker's lines come through as it writes them, not when a buffer fills.
	for waited := 0; !strings.Contains(r.out.String(), `[worker] {"time"`) || !strings.Contains(r.out.String(), `"msg":"worker running"`); waited++ {
		if waited == 100 {
			t.Fatalf("the worker's log lines are held back while it runs:\n%s", r.out)
		}
		time.Sleep(100 * time.Millisecond)
	}

	m := regexp.MustCompile(`Worker started \(pid (\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no worker pid in the output:\n%s", out)
	}
	pid, _ := strconv.Atoi(m[1])
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := r.exit(t); code == 0 {
		t.Errorf("exit status 0 after the worker died; output:\n%s", r.out)
	}
	if !strings.Contains(r.out.String(), "The worker stopped") {
		t.Errorf("the output does not say the worker stopped:\n%s", r.out)
	}
}
