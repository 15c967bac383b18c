package faulttest_test

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/faulttest"
)

// TestFaultSchedule runs the fixed short schedule (seed 1, every kind of fault twice,
// 45 s of load) in make test, or, with FAULTS_SEED / FAULTS_DURATION set (make faults),
// a random schedule of that length. FAULTS_CLOCK=off leaves the clock steps out;
// FAULTS_RACE_BINARIES=1 builds the binaries with -race too. It fails on any
// over-admission, lost or double-counted unit, or store that disagrees (the oracle's
// table says which).
func TestFaultSchedule(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault schedule runs real processes for a minute or more")
	}
	o := faulttest.Options{Seed: 1, Duration: 45 * time.Second, Each: 2}
	if s := os.Getenv("FAULTS_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("FAULTS_SEED=%q: want a number", s)
		}
		o.Seed, o.Each, o.Duration = seed, 0, 10*time.Minute
	}
	if s := os.Getenv("FAULTS_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 30*time.Second {
			t.Fatalf("FAULTS_DURATION=%q: want a duration of at least 30s", s)
		}
		o.Duration, o.Each = d, 0
	}
	o.Clock = os.Getenv("FAULTS_CLOCK") != "off"
	o.RaceBinaries = os.Getenv("FAULTS_RACE_BINARIES") == "1"
	v := faulttest.Run(t, o)
	t.Logf("oracle:\n%s", v.Report())
	for _, e := range v.Violations() {
		t.Errorf("seed %d: %s", o.Seed, e)
	}
}
