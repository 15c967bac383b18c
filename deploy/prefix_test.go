package deploy_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// With QUOTA_REDIS_PREFIX, installs sharing a Redis keep the counters of same-named
// orgs apart. Here the stack's api (default prefix "q") and another api on the same
// Redis and database with prefix "other" check the same user of the same org: each
// counts only its own checks.
func TestRedisPrefixKeepsInstallsApart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	st := testenv.StartStack(t, testenv.StackOptions{RedisDB: redisDB})
	other := st.StartAPI(t, "QUOTA_REDIS_PREFIX=other")
	check := `{"org":"demo","team":"eng","user":"alice"}`
	// The other install checks first: both share the database, and an api whose Redis
	// lacks an org's month counters fills them from the ledger, which the worker (of
	// prefix q) fills from q's counters. Checked after q's, the other install's first
	// check could find q's 3 already flushed there (CI: 4 under other).
	post(t, "http://"+other.Addr+"/v1/check", st.DemoKey, check)
	for range 3 {
		post(t, "http://"+st.APIAddr+"/v1/check", st.DemoKey, check)
	}

	opt, err := redis.ParseURL(st.RedisURL)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	used := func(prefix string) int64 {
		t.Helper()
		ks, err := rdb.Keys(ctx, prefix+":{demo}|m|*").Result()
		if err != nil || len(ks) != 1 {
			t.Fatalf("month hashes of prefix %s: %v, %v", prefix, ks, err)
		}
		n, err := rdb.HGet(ctx, ks[0], "requests|u|eng|alice").Int64()
		if err != nil {
			t.Fatalf("%s requests|u|eng|alice: %v", ks[0], err)
		}
		return n
	}
	if q, o := used("q"), used("other"); q != 3 || o != 1 {
		t.Errorf("alice's month counter: %d under q (want 3), %d under other (want 1)", q, o)
	}
	// Nothing of the other install is outside its prefix.
	all, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range all {
		if len(k) < 2 || (k[:2] != "q:" && (len(k) < 6 || k[:6] != "other:")) {
			t.Errorf("key %q has neither prefix", k)
		}
	}
}
