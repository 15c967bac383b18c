package quota_test

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The engine's key cache holds at most KeyCacheSize entries, evicting the least
// recently used, tells its hooks of every hit, miss and eviction, and an org whose
// keys were evicted is still counted right.
func TestKeyCacheBoundedWithHooks(t *testing.T) {
	t.Parallel()
	var hits, misses, evictions atomic.Int64
	const size = 8
	r := MustRig(t, "", quota.Config{KeyCacheSize: size, KeyCache: cachemetrics.Hooks{
		Hit: func() { hits.Add(1) }, Miss: func() { misses.Add(1) }, Evict: func() { evictions.Add(1) },
	}})
	base := testenv.ID(t, "org")
	orgs := make([]string, 100)
	for i := range orgs {
		orgs[i] = fmt.Sprintf("%s-%d", base, i)
	}
	check := func(org string) {
		t.Helper()
		r.MustCheck(t, quota.Request{Org: org, Metric: "requests", Cost: 1, Limits: quota.LevelLimits{Org: []vocab.Limit{lim(vocab.Minute, 10)}}})
	}
	for _, org := range orgs {
		check(org) // H, hydrate, then decided: two builds, a miss and a hit
	}
	if n := quota.KeyCacheLen(r.e); n > size {
		t.Errorf("%d entries held, want at most %d", n, size)
	}
	if misses.Load() != int64(len(orgs)) || hits.Load() != int64(len(orgs)) {
		t.Errorf("%d misses and %d hits, want %d of each", misses.Load(), hits.Load(), len(orgs))
	}
	if held := int64(quota.KeyCacheLen(r.e)); evictions.Load() != misses.Load()-held {
		t.Errorf("%d evictions, want misses - held = %d", evictions.Load(), misses.Load()-held)
	}
	last := orgs[len(orgs)-1]
	h := hits.Load()
	check(last) // just used: still held
	if hits.Load() != h+1 {
		t.Errorf("the last org's keys were not held")
	}
	check(orgs[0]) // evicted long ago: rebuilt, and its counter goes on
	if got := r.usage(t, orgs[0])[orgC("requests")]; got != 2 {
		t.Errorf("evicted org counted %d, want 2", got)
	}
}

// An engine's key cache holds, by default, the keys of 100,000 orgs: checks spread
// over every tenant of a replica whose org cache holds them all find their keys built
// instead of evicting one org's keys to build another's on every check.
func TestKeyCacheDefaultHoldsAHundredThousandOrgs(t *testing.T) {
	t.Parallel()
	var misses atomic.Int64
	r := MustRig(t, "", quota.Config{KeyCache: cachemetrics.Hooks{Miss: func() { misses.Add(1) }}})
	per := vocab.PeriodAt(time.Now(), 1)
	const orgs = 100_000
	for round := range 2 {
		for i := range orgs {
			quota.BuildOrgKeys(r.e, "org-"+strconv.Itoa(i), per)
		}
		if round == 0 {
			misses.Store(0)
		}
	}
	if n := misses.Load(); n != 0 {
		t.Errorf("a second pass over %d orgs missed %d times (%d entries held), want 0", orgs, n, quota.KeyCacheLen(r.e))
	}
}
