package testenv_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// TestProcStopKillAndStartAgain: Stop gives a process that ignores SIGTERM its grace
// and then kills it; Kill9 does not wait; a stopped process starts again with the
// same command line; Tail keeps only the end of the output and counts race reports.
func TestProcStopKillAndStartAgain(t *testing.T) {
	p := &testenv.Proc{Name: "stubborn", Path: "bash", Args: []string{"-c",
		`trap '' TERM; printf 'x%.0s' {1..100}; echo 'WARNING: DATA RACE'; echo ready; sleep 30`},
		Log: &testenv.Tail{Max: 40}}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err == nil {
		t.Fatal("a second Start of a running process must fail")
	}
	waitFor(t, func() bool { return strings.HasSuffix(p.Log.String(), "ready\n") })
	if got := len(p.Log.String()); got > 40 {
		t.Errorf("the tail holds %d bytes, want at most 40", got)
	}
	if n := p.Log.RaceReports(); n != 1 {
		t.Errorf("race reports = %d, want 1", n)
	}
	if !p.Running() {
		t.Fatal("not running after Start")
	}
	begin := time.Now()
	p.Stop(300 * time.Millisecond)
	if took := time.Since(begin); took < 300*time.Millisecond || took > 10*time.Second {
		t.Errorf("Stop of a process that ignores SIGTERM took %v, want its grace then a kill", took)
	}
	if p.Running() {
		t.Fatal("running after Stop")
	}
	p.Stop(time.Second) // not running: nothing to do
	if err := p.Signal(syscall.SIGTERM); err == nil {
		t.Error("Signal to a stopped process must fail")
	}

	if err := p.Start(); err != nil {
		t.Fatalf("start again: %v", err)
	}
	waitFor(t, func() bool { return p.Log.RaceReports() == 2 })
	begin = time.Now()
	p.Kill9()
	if took := time.Since(begin); took > 5*time.Second || p.Running() {
		t.Errorf("Kill9 took %v, running=%v", took, p.Running())
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
