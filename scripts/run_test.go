// Package scripts_test tests how a newcomer starts Quotaplane: scripts/run.sh, the
// script behind `make run`, must fail loudly and at once when the api or the worker
// cannot run, and otherwise serve with the demo's keys printed; docker-compose.yml
// must not start with a known secret or publish the api to the network; make fuzz
// must tell a real finding from the Go toolchain's fuzztime race.
package scripts_test

import (
	"context"
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

	"github.com/jackc/pgx/v5"

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
	return startCmd(t, env, "bash", "scripts/run.sh")
}

// startCmd is start running name and args (make run, as a newcomer types it).
func startCmd(t *testing.T, env map[string]string, name string, args ...string) *run {
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
	r.cmd = exec.Command(name, args...)
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

// A busy port stops the run before it builds or seeds anything (the seed would change
// the shared database, and the probes would reach the other instance and print
// "started"), naming the variable and the address.
func TestRunStopsBeforeAnythingWhenAPortIsBusy(t *testing.T) {
	for _, name := range []string{"QUOTA_HTTP_ADDR", "QUOTA_WORKER_HTTP_ADDR", "QUOTA_GRPC_ADDR", "QUOTA_METRICS_ADDR"} {
		t.Run(name, func(t *testing.T) {
			addr := busy(t)
			dbURL := testenv.PostgresURL(t)
			r := start(t, map[string]string{name: addr, "DATABASE_URL": dbURL})
			if code := r.exit(t); code == 0 {
				t.Errorf("exit status 0 with %s busy; output:\n%s", name, r.out)
			}
			out := r.out.String()
			if !strings.Contains(out, name+"="+addr+" is taken") {
				t.Errorf("the output does not say %s=%s is taken:\n%s", name, addr, out)
			}
			for _, never := range []string{"Building", "started", "Demo"} {
				if strings.Contains(out, never) {
					t.Errorf("the output says %q though the run stopped first:\n%s", never, out)
				}
			}
			if n := demoOrgs(t, dbURL); n != 0 {
				t.Errorf("%d demo orgs in the database after the run stopped on a busy port", n)
			}
		})
	}
}

// demoOrgs counts the demo org in the database at dbURL (0 when it was never migrated).
func demoOrgs(t *testing.T, dbURL string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM orgs WHERE id = 'demo'`).Scan(&n); err != nil {
		return 0 // no orgs table: nothing was migrated either
	}
	return n
}

// serving waits until the run's api answers /healthz.
func (r *run) serving(t *testing.T) {
	t.Helper()
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
}

// Ctrl-C (SIGINT to the terminal's process group, through make as a newcomer runs it)
// stops both binaries and says so: "Stopping...", never "the api was stopped, so the
// run stops too". This guards the behaviour of a run in a terminal.
func TestCtrlCStopsTheRun(t *testing.T) {
	out := ctrlCStops(t, "make", "--no-print-directory", "run")
	// make answers a recipe that exits 130 with "Error 130", which reads as a
	// failure; run.sh dies of SIGINT instead, and make says "Interrupt".
	if strings.Contains(out, "Error 130") {
		t.Errorf("after Ctrl-C make reported an error:\n%s", out)
	}
}

// Ctrl-C of a run whose shell was started with SIGINT ignored (`make run &` from a
// script without job control, as a harness runs it): bash cannot trap SIGINT then,
// but the binaries stop on it, and the run says "Stopping...", never "The api was
// stopped ..., so the run stops too", and make does not say Error 1.
func TestCtrlCStopsARunStartedWithSIGINTIgnored(t *testing.T) {
	_ = ctrlCStops(t, "sh", "-c", "trap '' INT; exec make --no-print-directory run")
}

// ctrlCStops starts the command, and once the run serves sends SIGINT to its process
// group, as a terminal's Ctrl-C does: the run must say "Stopping...", exit non-zero
// and leave no api answering. It returns the run's output.
func ctrlCStops(t *testing.T, name string, args ...string) string {
	t.Helper()
	r := startCmd(t, nil, name, args...)
	r.serving(t)
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGINT)
	code := r.exit(t)
	out := r.out.String()
	if !strings.Contains(out, "Stopping...") || strings.Contains(out, "so the run stops too") || code == 0 {
		t.Errorf("after Ctrl-C: exit %d, want Stopping... and a non-zero exit; output:\n%s", code, out)
	}
	if resp, err := http.Get("http://" + r.api + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("the api still answers after Ctrl-C")
	}
	return out
}

// The healthy run prints the demo's keys and serves; a worker that dies later stops
// the whole run, since nothing would be persisted without it.
func TestRunServesThenStopsWhenTheWorkerDies(t *testing.T) {
	r := start(t, nil)
	r.serving(t)
	out := r.out.String()
	for _, want := range []string{"Operator token:  ", "Demo org key:    qpk_", "Console:         http://127.0.0.1:", "/console/?org=demo  (sign in as ", "Worker started"} {
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
