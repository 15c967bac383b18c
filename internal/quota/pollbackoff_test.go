package quota_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The background polls of a dedicated Redis that fails back off (doubling, capped),
// so an org's unreachable redis_url is not warned about several times a second: the
// sweep reports it at most once per pause, and PollEngine answers ErrAway without
// trying; once it answers again, the backoff ends.
func TestDedicatedRedisAwayIsPolledWithBackoff(t *testing.T) {
	t.Parallel()
	dedicated := MustPrivateRedis(t)
	dedicated.Kill(t)
	r, _ := MustEngines(t, quota.EnginesConfig{PollBackoff: quota.PollBackoff{Min: 50 * time.Millisecond, Max: 200 * time.Millisecond}})
	route := vocab.Route{RedisURL: dedicated.URL()}
	if _, err := r.EngineFor(route); err != nil { // opened, as the worker's flush opens it
		t.Fatal(err)
	}

	var reports atomic.Int64
	var last atomic.Value
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r.RunReservationSweep(ctx, 5*time.Millisecond, func(err error) { reports.Add(1); last.Store(err.Error()) })
		close(done)
	}()
	time.Sleep(1200 * time.Millisecond)
	// Without a backoff: one report per 5 ms sweep, about 240. With it: a pause of
	// 50, 100, then 200 ms each: about 8.
	if n := reports.Load(); n < 2 || n > 12 {
		t.Errorf("%d reports of the away Redis in 1.2 s, want a handful (backoff 50 ms doubling to 200 ms)", n)
	}
	if s, _ := last.Load().(string); !strings.Contains(s, "next try in") {
		t.Errorf("the report %q does not say when the next try is", s)
	}

	// PollEngine: a poll's failure starts the pause, during which it answers ErrAway.
	waitUntil(t, func() bool { _, _, err := r.PollEngine(route); return err == nil })
	_, poll, err := r.PollEngine(route)
	if err != nil {
		t.Fatal(err)
	}
	if err := poll(quota.ErrUnavailable); err == nil || !errors.Is(err, quota.ErrUnavailable) {
		t.Errorf("a failed poll's report: %v", err)
	}
	if _, _, err := r.PollEngine(route); !errors.Is(err, quota.ErrAway) {
		t.Errorf("PollEngine in the pause: %v, want ErrAway", err)
	}

	// Back: the sweep succeeds, and no more reports come.
	dedicated.Restart(t)
	time.Sleep(400 * time.Millisecond) // past the longest pause: the sweep has tried again
	before := reports.Load()
	time.Sleep(300 * time.Millisecond)
	if n := reports.Load() - before; n != 0 {
		t.Errorf("%d reports after the Redis came back", n)
	}
	if _, _, err := r.PollEngine(route); err != nil {
		t.Errorf("PollEngine after the Redis came back: %v", err)
	}
	cancel()
	<-done

	// A pool's Redis has no backoff: polls always go through.
	_, poll, err = r.PollEngine(vocab.Route{})
	if err != nil {
		t.Fatal(err)
	}
	_ = poll(quota.ErrUnavailable)
	if _, _, err := r.PollEngine(vocab.Route{}); err != nil {
		t.Errorf("the default pool after a failed poll: %v", err)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; !cond(); i++ {
		if i == 200 {
			t.Fatal("timed out")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
