package quota_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// fakeHydrator returns fixed stored usage and counts its calls.
type fakeHydrator struct {
	mu     sync.Mutex
	stored map[string]map[quota.Counter]int64 // by org
	err    error
	calls  atomic.Int64
}

func (f *fakeHydrator) StoredUsage(_ context.Context, org string, _ vocab.Period) (map[quota.Counter]int64, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stored[org], f.err
}

func TestHydration(t *testing.T) {
	t.Parallel()
	h := &fakeHydrator{stored: map[string]map[quota.Counter]int64{}}
	r := MustRig(t, "", quota.Config{Hydrator: h})
	limits := quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Month, 1000)}, User: []vocab.Limit{lim(vocab.Month, 100)}}

	tests := []struct {
		name     string
		stored   map[quota.Counter]int64
		inRedis  map[quota.Counter]int64 // counters left in Redis after the wipe (partial loss)
		checks   int
		want     map[quota.Counter]int64
		wantDeny bool
	}{
		{
			name:   "stored usage restored before deciding",
			stored: map[quota.Counter]int64{orgC("requests"): 500, teamC("requests", "eng"): 300, userC("requests", "eng", "alice"): 50},
			checks: 1,
			want:   map[quota.Counter]int64{orgC("requests"): 501, teamC("requests", "eng"): 301, userC("requests", "eng", "alice"): 51},
		},
		{
			name:    "max of existing and stored",
			stored:  map[quota.Counter]int64{orgC("requests"): 500, teamC("requests", "eng"): 300, userC("requests", "eng", "alice"): 50},
			inRedis: map[quota.Counter]int64{orgC("requests"): 420, userC("requests", "eng", "alice"): 80},
			checks:  1,
			want:    map[quota.Counter]int64{orgC("requests"): 501, teamC("requests", "eng"): 301, userC("requests", "eng", "alice"): 81},
		},
		{
			name:     "restored usage counts against the limit",
			stored:   map[quota.Counter]int64{userC("requests", "eng", "alice"): 100},
			checks:   1,
			want:     map[quota.Counter]int64{userC("requests", "eng", "alice"): 100},
			wantDeny: true,
		},
		{
			name:   "concurrent checks after a wipe hydrate once and all count",
			stored: map[quota.Counter]int64{orgC("requests"): 10},
			checks: 16,
			want:   map[quota.Counter]int64{orgC("requests"): 26, teamC("requests", "eng"): 16, userC("requests", "eng", "alice"): 16},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			org := testenv.ID(t, "org")
			req := quota.Request{Org: org, Team: "eng", User: "alice", Metric: "requests", Cost: 1, Limits: limits}
			// A first check makes the period live; then Redis "loses" the org.
			r.MustCheck(t, req)
			r.wipeOrg(t, org)
			h.mu.Lock()
			h.stored[org] = tt.stored
			h.mu.Unlock()
			ctx := context.Background()
			for c, v := range tt.inRedis {
				field := c.Metric + "|o"
				switch c.Level {
				case vocab.LevelTeam:
					field = c.Metric + "|t|" + c.Team
				case vocab.LevelUser:
					field = c.Metric + "|u|" + c.Team + "|" + c.User
				}
				r.raw.HSet(ctx, r.prefix+":{"+org+"}|m|"+r.e.Period(1).ID, field, v)
			}
			var wg sync.WaitGroup
			var denied atomic.Int64
			for range tt.checks {
				wg.Go(func() {
					res, err := r.e.Check(ctx, req)
					if err != nil {
						t.Error(err)
					} else if !res.Allowed {
						denied.Add(1)
					}
				})
			}
			wg.Wait()
			if tt.wantDeny != (denied.Load() > 0) {
				t.Errorf("denied %d checks, want denial %v", denied.Load(), tt.wantDeny)
			}
			if diff := cmp.Diff(tt.want, r.usage(t, org)); diff != "" {
				t.Errorf("usage after hydration (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHydrationFailureCountsNothing(t *testing.T) {
	t.Parallel()
	h := &fakeHydrator{err: errors.New("postgres down")}
	r := MustRig(t, "", quota.Config{Hydrator: h})
	org := testenv.ID(t, "org")
	_, err := r.e.Check(context.Background(), quota.Request{Org: org, Metric: "requests", Cost: 1})
	if !errors.Is(err, quota.ErrNotHydrated) {
		t.Fatalf("Check = %v, want ErrNotHydrated", err)
	}
	if got := r.snapshot(t, org); len(got) != 0 {
		t.Errorf("counters written without hydration: %v", got)
	}
	_, errs := r.e.CheckBatch(context.Background(), []quota.Request{{Org: org, Metric: "requests", Cost: 1}})
	if !errors.Is(errs[0], quota.ErrNotHydrated) {
		t.Errorf("CheckBatch error = %v, want ErrNotHydrated", errs[0])
	}
}

func TestDrainDirty(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	ctx := context.Background()
	org := testenv.ID(t, "org")
	per := r.e.Period(1).ID
	check := func(team, user, metric string, cost int64) {
		r.MustCheck(t, quota.Request{Org: org, Team: team, User: user, Metric: metric, Cost: cost})
	}
	check("eng", "alice", "requests", 2)
	check("eng", "bob", "requests", 1)
	check("ops", "", "tokens", 70)

	steps := []struct {
		name string
		do   func()
		want map[quota.Counter]int64
	}{
		{
			name: "first drain returns every changed counter",
			do:   func() {},
			want: map[quota.Counter]int64{
				orgC("requests"): 3, teamC("requests", "eng"): 3,
				userC("requests", "eng", "alice"): 2, userC("requests", "eng", "bob"): 1,
				orgC("tokens"): 70, teamC("tokens", "ops"): 70,
			},
		},
		{name: "second drain is empty", do: func() {}, want: map[quota.Counter]int64{}},
		{
			name: "only counters changed since",
			do:   func() { check("eng", "bob", "requests", 5) },
			want: map[quota.Counter]int64{orgC("requests"): 8, teamC("requests", "eng"): 8, userC("requests", "eng", "bob"): 6},
		},
	}
	for _, s := range steps {
		s.do()
		got, err := r.e.DrainDirty(ctx, org, per)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if diff := cmp.Diff(s.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.name, diff)
		}
		// The set outlives every drain, with its TTL, so the org's keys are all present
		// or all absent: a cluster slot migration never finds them split.
		dirty := r.prefix + ":{" + org + "}|d|" + per
		if n, ttl := r.raw.Exists(ctx, dirty).Val(), r.raw.TTL(ctx, dirty).Val(); n != 1 || ttl <= 0 {
			t.Errorf("%s: dirty set exists=%d ttl=%v, want kept with its TTL", s.name, n, ttl)
		}
	}
	if _, err := r.e.DrainDirty(ctx, org, "2026-13"); !errors.Is(err, quota.ErrInvalid) {
		t.Errorf("DrainDirty with a bad period = %v, want ErrInvalid", err)
	}
}

// TestKeyLayoutAndTTLs pins the key layout of KEYS.md and that every key expires.
func TestKeyLayoutAndTTLs(t *testing.T) {
	t.Parallel()
	r := MustRig(t, "", quota.Config{})
	ctx := context.Background()
	org := testenv.ID(t, "a.b:c@d")
	r.MustCheck(t, quota.Request{Org: org, Team: "t.1", User: "u:1@x", Unregistered: true, Metric: "requests", Cost: 1,
		IdempotencyKey: "key-00000001", Limits: quota.LevelLimits{User: []vocab.Limit{lim(vocab.Minute, 5), lim(vocab.Second, 5)}}})
	per := r.e.Period(1)
	tag := r.prefix + ":{" + org + "}|"
	untilEnd := time.Until(per.End.Add(7 * 24 * time.Hour))
	keys, err := r.raw.Keys(ctx, r.prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, k := range keys {
		if k == r.prefix+":|o" {
			// The dirty-org index: no TTL, one member per org, emptied by the
			// worker's every flush.
			if got := r.raw.SMembers(ctx, k).Val(); !cmp.Equal(got, []string{org}) || r.raw.TTL(ctx, k).Val() != -1 {
				t.Errorf("dirty-org index %q holds %q, want only the org, no TTL", k, got)
			}
			kinds["o"]++
			continue
		}
		if !strings.HasPrefix(k, tag) {
			t.Errorf("key %q outside the org's hash tag %q", k, tag)
			continue
		}
		ttl := r.raw.TTL(ctx, k).Val()
		rest := strings.TrimPrefix(k, tag)
		kind := rest[:1]
		kinds[kind]++
		var lo, hi time.Duration
		switch {
		case rest == "m|"+per.ID, rest == "d|"+per.ID, rest == "u|"+per.ID: // u: the unregistered users
			lo, hi = untilEnd-time.Minute, untilEnd+time.Minute
		case rest == "n": // the count of idempotency records: the TTL + a bucket (1 h)
			lo, hi = 24*time.Hour, 25*time.Hour
		case strings.HasPrefix(rest, "w|60|"):
			lo, hi = 60*time.Second, 121*time.Second
		case strings.HasPrefix(rest, "w|1|"):
			lo, hi = 0, 3*time.Second
		case rest == "i|key-00000001":
			lo, hi = 23*time.Hour, 24*time.Hour
		default:
			t.Errorf("unexpected key %q", k)
			continue
		}
		if ttl < lo || ttl > hi {
			t.Errorf("key %q: TTL %v, want within [%v, %v]", k, ttl, lo, hi)
		}
	}
	if diff := cmp.Diff(map[string]int{"m": 1, "d": 1, "w": 2, "i": 1, "o": 1, "n": 1, "u": 1}, kinds); diff != "" {
		t.Errorf("keys by kind (-want +got):\n%s", diff)
	}
	fields := r.raw.HKeys(ctx, tag+"m|"+per.ID).Val()
	if diff := cmp.Diff([]string{"|p", "requests|o", "requests|t|t.1", "requests|u|t.1|u:1@x"}, fields); diff != "" {
		t.Errorf("month counter fields (-want +got):\n%s", diff)
	}
}
