package testenv

import (
	"bytes"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is a child process a test may kill -9, stop and start again with the same
// command line and environment (the fault schedule, the alert suite). It gets
// SIGKILL when the test's own process dies (Pdeathsig), so nothing outlives a test
// that was killed itself.
type Proc struct {
	Name string
	Path string
	Args []string
	Env  []string
	Log  *Tail // the last 32 KiB it wrote, unless set before Start

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts the process; it fails if it is running already.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.Name)
	}
	if p.Log == nil {
		p.Log = &Tail{Max: 32 << 10}
	}
	c := exec.Command(p.Path, p.Args...)
	c.Env = p.Env
	c.Stdout, c.Stderr = p.Log, p.Log
	c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	p.cmd, p.done = c, done
	return nil
}

// Running reports whether the process was started and has not exited.
func (p *Proc) Running() bool {
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

// Kill9 sends SIGKILL and waits for the exit: no shutdown hook runs. It does
// nothing when the process is not running.
func (p *Proc) Kill9() { p.end(0) }

// Stop sends SIGTERM, SIGKILL if the process has not exited within grace, and
// waits for the exit; it does nothing when the process is not running.
func (p *Proc) Stop(grace time.Duration) { p.end(grace) }

func (p *Proc) end(grace time.Duration) {
	p.mu.Lock()
	c, done := p.cmd, p.done
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
	if c == nil {
		return
	}
	if grace > 0 {
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
			return
		case <-time.After(grace):
		}
	}
	_ = c.Process.Signal(syscall.SIGKILL)
	<-done
}

// Signal sends sig to the running process.
func (p *Proc) Signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s is not running", p.Name)
	}
	return p.cmd.Process.Signal(sig)
}

// Tail keeps the last Max bytes a process wrote, for a failure message, and counts
// the data races a binary built with -race reported.
type Tail struct {
	Max   int
	mu    sync.Mutex
	buf   []byte
	races int
}

func (b *Tail) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.races += bytes.Count(p, []byte("WARNING: DATA RACE"))
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.Max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *Tail) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// RaceReports returns how many data races the process reported so far.
func (b *Tail) RaceReports() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.races
}
