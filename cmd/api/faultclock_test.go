package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// The clock fault hook of a real process: with QUOTA_FAULT_CLOCK=on, SIGUSR1 steps the
// engine's wall clock by +2 s and SIGUSR2 by -2 s (cumulative), each logged as a JSON
// line "clock stepped", and checks decide as before the steps: a second window's
// bucket (its reset_at) stays where Redis time puts it, and the counters run on.
func TestFaultClockHookStepsNoDecision(t *testing.T) {
	addr, token := freeAddr(t), "a-test-operator-token"
	cmd, stderr := startMain(t, map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"QUOTA_HTTP_ADDR": addr, "QUOTA_ADMIN_TOKEN": token, "QUOTA_FAULT_CLOCK": "on"})
	base := "http://" + addr
	do := func(path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("api not ready: %v; stderr:\n%s", err, stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	org := testenv.ID(t, "org")
	if code, b := do("/v1/plans", `{"id":"p-`+org+`","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"second","limit":1000},{"metric":"requests","window":"month","limit":1000}]}`); code != 201 {
		t.Fatalf("create plan: %d %s", code, b)
	}
	if code, b := do("/v1/orgs", `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`); code != 201 {
		t.Fatalf("create org: %d %s", code, b)
	}
	checks := 0
	check := func(when string) {
		t.Helper()
		sent := time.Now()
		code, b := do("/v1/check", `{"org":"`+org+`"}`)
		checks++
		var res struct {
			Allowed bool `json:"allowed"`
			Levels  []struct {
				Window  string    `json:"window"`
				Used    int64     `json:"used"`
				ResetAt time.Time `json:"reset_at"`
			} `json:"levels"`
		}
		if err := json.Unmarshal(b, &res); code != 200 || err != nil || !res.Allowed || len(res.Levels) != 2 {
			t.Fatalf("%s: check = %d %s", when, code, b)
		}
		for _, l := range res.Levels {
			switch l.Window {
			case "month":
				if l.Used != int64(checks) {
					t.Errorf("%s: month used %d, want %d: the counters run on", when, l.Used, checks)
				}
			case "second": // the end of the current one-second bucket of Redis time
				if in := l.ResetAt.Sub(sent); in < -500*time.Millisecond || in > 1500*time.Millisecond {
					t.Errorf("%s: the second window resets %v after the check was sent, want within 1 s: its bucket moved", when, in)
				}
			}
		}
	}
	check("before any step")
	waitLog := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(stderr.String(), want) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s logged; stderr:\n%s", want, stderr)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGUSR1)
	waitLog(`"msg":"clock stepped","by":"2s","step":"2s"`)
	check("after a +2 s step")
	_ = cmd.Process.Signal(syscall.SIGUSR2)
	waitLog(`"step":"0s"`)
	_ = cmd.Process.Signal(syscall.SIGUSR2)
	waitLog(`"msg":"clock stepped","by":"-2s","step":"-2s"`)
	check("after a -2 s step")
	for i := range 3 {
		check(fmt.Sprintf("check %d after the steps", i))
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	testenv.AssertJSONLines(t, stderr.String())
}
