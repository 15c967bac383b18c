package scripts_test

import (
	"errors"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// scriptBlock is the README's ```sh block that starts make run from a script and
// stops it: the one that names run.pid.
func scriptBlock(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(block[1], "run.pid") {
			return block[1]
		}
	}
	t.Fatal("README.md has no ```sh block that names run.pid: how does a script stop make run?")
	return ""
}

// copyCheckout copies the checkout at root into a new directory, without what git
// ignores there (.quotaplane, bin, node_modules), so that a run in the copy has a
// .quotaplane of its own, as a fresh clone has.
func copyCheckout(t *testing.T, root string) string {
	t.Helper()
	dst := t.TempDir()
	skip := map[string]bool{".git": true, ".quotaplane": true, "bin": true, "node_modules": true, "test-output": true}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel != "." && skip[d.Name()] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case d.IsDir():
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dst, rel), b, info.Mode().Perm())
		}
		return nil // symlinks and the like: none is needed to build and run
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// A script starts make run in the background and stops it exactly as the README says.
// Before, nothing a script could send stopped it: make in a script's background job
// ignores SIGINT (so kill -INT of its pid did nothing, nor of run.sh, which cannot
// trap a signal ignored at its start), and on SIGINT make waits for its recipe. Also
// kill -INT of run.pid (as Ctrl-C) and kill of make's own pid ($!, SIGTERM, which make
// passes on), as the README says, in a non-interactive bash without job control.
func TestAScriptStopsTheRunAsTheREADMESays(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs make run")
	}
	root := testenv.RepoRoot(t)
	block := scriptBlock(t, root)
	stop := regexp.MustCompile(`(?m)^kill "\$\(cat \.quotaplane/run\.pid\)"`)
	if !stop.MatchString(block) {
		t.Fatalf("the README's script block no longer stops the run with kill \"$(cat .quotaplane/run.pid)\":\n%s", block)
	}
	dir := copyCheckout(t, root)
	dbURL := testenv.PostgresURL(t)
	for _, c := range []struct {
		name, kill string
		exit       int    // the script's, which ends with make's status
		says       string // make's last words
	}{
		{"as printed", "", 0, ""},
		{"kill -INT of run.pid", `kill -INT "$(cat .quotaplane/run.pid)"`, 2, "Interrupt"},
		{"kill of make's pid", `kill $!`, 143, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			script := block
			if c.kill != "" {
				script = stop.ReplaceAllLiteralString(block, c.kill)
			}
			scriptStops(t, dir, dbURL, script, c.exit, c.says)
		})
	}
}

// scriptStops runs script with bash in dir, as a non-interactive script runs, and
// checks that it ends with exit status want, that both binaries and run.pid are gone,
// and that the run said "Stopping..." and, when says is set, make said it.
func scriptStops(t *testing.T, dir, dbURL, script string, want int, says string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.sh")
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		t.Fatal(err)
	}
	api := freeAddr(t)
	cmd := exec.Command("bash", path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dbURL, "REDIS_URL="+testenv.RedisURL(t),
		"QUOTA_HTTP_ADDR="+api, "QUOTA_WORKER_HTTP_ADDR="+freeAddr(t), "QUOTA_GRPC_ADDR="+freeAddr(t),
		"QUOTA_ADMIN_TOKEN=", "QUOTA_WEBHOOK_SECRET=", "QUOTA_PPROF_ADDR=", "QUOTA_STATE_DIR=", "QUOTA_BIN_DIR=")
	out := &testenv.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * limit): // the first run builds both binaries in the copy
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		log, _ := os.ReadFile(filepath.Join(dir, "run.log"))
		t.Fatalf("the script still runs after %s; its output:\n%s\nrun.log:\n%s", 2*limit, out, log)
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "run.log"))
	log := string(b)
	defer func() {
		if t.Failed() {
			t.Logf("the script's output:\n%s\nrun.log:\n%s", out, log)
		}
	}()
	if code := cmd.ProcessState.ExitCode(); code != want {
		t.Errorf("the script exits %d, want %d", code, want)
	}
	if !strings.Contains(log, "Stopping...") || strings.Contains(log, "so the run stops too") {
		t.Errorf("run.log does not say Stopping..., or says a binary stopped by itself")
	}
	if says != "" && !strings.Contains(log, says) {
		t.Errorf("make does not say %q", says)
	}
	if says == "" && strings.Contains(log, "make: ***") {
		t.Errorf("make reports an error")
	}
	for _, name := range []string{"Worker", "API"} {
		m := regexp.MustCompile(name + ` started \(pid (\d+)`).FindStringSubmatch(log)
		if m == nil {
			t.Fatalf("run.log names no %s pid", name)
		}
		pid, _ := strconv.Atoi(m[1])
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("the %s (pid %d) still runs after the script stopped the run", name, pid)
		}
	}
	if resp, err := http.Get("http://" + api + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("the api still answers")
	}
	if _, err := os.Stat(filepath.Join(dir, ".quotaplane", "run.pid")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf(".quotaplane/run.pid is left behind (%v)", err)
	}
}
