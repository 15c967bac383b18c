package quota_test

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// testRig is an engine on the shared test Redis with a key prefix of its own, plus a
// plain client for inspecting keys.
type testRig struct {
	e      *quota.Engine
	rdb    *redis.Client // the engine's client (no retries)
	raw    *redis.Client // for inspection
	prefix string
}

// MustRig starts an engine on url (the shared test Redis when empty) and removes its
// keys and closes everything when the test ends.
func MustRig(tb testing.TB, url string, cfg quota.Config) *testRig {
	tb.Helper()
	if url == "" {
		url = testenv.RedisURL(tb)
	}
	opt, err := quota.ClientOptions(url)
	if err != nil {
		tb.Fatal(err)
	}
	return MustRigOptions(tb, opt, cfg)
}

// MustRigOptions is MustRig with explicit client options.
func MustRigOptions(tb testing.TB, opt *redis.Options, cfg quota.Config) *testRig {
	tb.Helper()
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = testenv.ID(tb, "qt")
	}
	rdb := redis.NewClient(opt)
	rawOpt := *opt
	rawOpt.MaxRetries = 0
	raw := redis.NewClient(&rawOpt)
	e, err := quota.New(rdb, cfg)
	if err != nil {
		tb.Fatalf("quota.New: %v", err)
	}
	r := &testRig{e: e, rdb: rdb, raw: raw, prefix: cfg.KeyPrefix}
	tb.Cleanup(func() {
		_ = e.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.deleteKeys(ctx, cfg.KeyPrefix+":*")
		_ = rdb.Close()
		_ = raw.Close()
	})
	return r
}

func (r *testRig) deleteKeys(ctx context.Context, pattern string) {
	iter := r.raw.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			r.raw.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		r.raw.Del(ctx, keys...)
	}
}

// wipeOrg deletes every key of org, as a Redis restart without persistence would.
func (r *testRig) wipeOrg(tb testing.TB, org string) {
	tb.Helper()
	r.deleteKeys(context.Background(), r.prefix+":{"+org+"}|*")
}

// snapshot returns every counter of org in Redis (month and sliding-window hashes,
// the dirty set; not the period marker), keyed "key field", to compare before and after a check.
func (r *testRig) snapshot(tb testing.TB, org string) map[string]string {
	tb.Helper()
	ctx := context.Background()
	out := map[string]string{}
	iter := r.raw.Scan(ctx, 0, r.prefix+":{"+org+"}|*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if strings.Contains(k, "}|b|") {
			// would-block records are added about once a second after the checks that
			// made them (wouldblock.go), by no check: not a check's counters
			continue
		}
		switch r.raw.Type(ctx, k).Val() {
		case "hash":
			for f, v := range r.raw.HGetAll(ctx, k).Val() {
				if f == "|p" {
					continue // the period marker, not a counter
				}
				out[k+" "+f] = v
			}
		case "set":
			m := r.raw.SMembers(ctx, k).Val()
			sort.Strings(m)
			out[k] = strings.Join(m, ",")
		}
	}
	if err := iter.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// usage reads the month counters of org in the engine's current period.
func (r *testRig) usage(tb testing.TB, org string) map[quota.Counter]int64 {
	tb.Helper()
	u, err := r.e.MonthUsage(context.Background(), org, r.e.Period(1).ID)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// MustCheck runs a check that must not fail.
func (r *testRig) MustCheck(tb testing.TB, req quota.Request) vocab.Result {
	tb.Helper()
	res, err := r.e.Check(context.Background(), req)
	if err != nil {
		tb.Fatalf("Check(%+v): %v", req, err)
	}
	return res
}

func orgC(metric string) quota.Counter { return quota.Counter{Metric: metric, Level: vocab.LevelOrg} }
func teamC(metric, team string) quota.Counter {
	return quota.Counter{Metric: metric, Level: vocab.LevelTeam, Team: team}
}
func userC(metric, team, user string) quota.Counter {
	return quota.Counter{Metric: metric, Level: vocab.LevelUser, Team: team, User: user}
}

func lim(w vocab.Window, n int64) vocab.Limit { return vocab.Limit{Window: w, Limit: n} }
