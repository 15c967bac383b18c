package faulttest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// tailBuffer keeps the last max bytes a process wrote, for a failure message, and
// counts the data races a binary built with -race reported.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	races int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.races += bytes.Count(p, []byte("WARNING: DATA RACE"))
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// proc is one child process the driver may kill -9 and start again, with the same
// command line and environment. Every child gets SIGKILL when the driver's process
// dies (Pdeathsig), so nothing outlives a driver killed itself.
type proc struct {
	name string
	path string
	args []string
	env  []string
	log  *tailBuffer

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func newProc(name, path string, args, env []string) *proc {
	return &proc{name: name, path: path, args: args, env: env, log: &tailBuffer{max: 32 << 10}}
}

func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.name)
	}
	c := exec.Command(p.path, p.args...)
	c.Env = p.env
	c.Stdout, c.Stderr = p.log, p.log
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	p.cmd, p.done = c, done
	return nil
}

// running reports whether the process was started and has not exited.
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill9 sends SIGKILL and waits for the exit: no shutdown hook runs.
func (p *proc) kill9() {
	p.mu.Lock()
	c, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	if c == nil {
		return
	}
	_ = c.Process.Signal(syscall.SIGKILL)
	<-done
}

// stop sends SIGTERM and kills the process if it has not exited within grace.
func (p *proc) stop(grace time.Duration) {
	p.mu.Lock()
	c, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	if c == nil {
		return
	}
	_ = c.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = c.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// buildBinaries builds quotaplane-api and quotaplane-worker from the checkout at root
// into dir, with -race when race is set.
func buildBinaries(ctx context.Context, root, dir string, race bool) (api, worker string, err error) {
	for _, b := range []struct{ name, pkg string }{{"quotaplane-api", "./cmd/api"}, {"quotaplane-worker", "./cmd/worker"}} {
		args := []string{"build"}
		if race {
			args = append(args, "-race")
		}
		args = append(args, "-o", filepath.Join(dir, b.name), b.pkg)
		build := exec.CommandContext(ctx, "go", args...)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return filepath.Join(dir, "quotaplane-api"), filepath.Join(dir, "quotaplane-worker"), nil
}

// waitHTTP polls url until it answers 200 or within passes.
func waitHTTP(url string, within time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for {
		res, err := client.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("answered %d", res.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w", url, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redisServer is a private redis-server without persistence on a port of its own:
// killed -9 and started again it comes back empty on the same port.
type redisServer struct {
	*proc
	port int
}

func newRedisServer(port int) *redisServer {
	return &redisServer{port: port, proc: newProc("redis-server", "redis-server",
		[]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--protected-mode", "no"}, os.Environ())}
}

func (r *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

// startAndWait starts the server and waits until it answers PING.
func (r *redisServer) startAndWait() error {
	if err := r.start(); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: r.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s does not answer: %w", r.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// raceReports returns how many data races the process reported so far.
func (b *tailBuffer) raceReports() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.races
}
