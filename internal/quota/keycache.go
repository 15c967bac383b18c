package quota

import (
	"hash/maphash"
	"strconv"
	"sync/atomic"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// keyCacheShards is the most shards of an engine's key cache: the least recently used
// entry is evicted within its shard, and no lock is global.
const keyCacheShards = 64

// keyCache holds the shared EVALSHA arguments of each org and period (orgKeys),
// bounded in entries: hashicorp/golang-lru, one LRU per shard.
type keyCache struct {
	shards []*lru.Cache[orgPeriod, *orgKeys]
	hooks  cachemetrics.Hooks // never nil funcs
}

type orgPeriod struct{ org, period string }

var keySeed = maphash.MakeSeed()

// newKeyCache makes a cache of about size entries (at least size, less than size plus
// the number of shards).
func newKeyCache(size int, hooks cachemetrics.Hooks) *keyCache {
	n := min(keyCacheShards, size)
	per := (size + n - 1) / n
	hooks = hooks.OrNop()
	onEvict := func(orgPeriod, *orgKeys) { hooks.Evict() }
	kc := &keyCache{shards: make([]*lru.Cache[orgPeriod, *orgKeys], n), hooks: hooks}
	for i := range kc.shards {
		kc.shards[i], _ = lru.NewWithEvict(per, onEvict) // per > 0: no error
	}
	return kc
}

// len is the number of entries held.
func (kc *keyCache) len() int {
	n := 0
	for _, s := range kc.shards {
		n += s.Len()
	}
	return n
}

// orgKeys returns the shared arguments of org's checks in per.
func (e *Engine) orgKeys(org string, per vocab.Period) *orgKeys {
	kc := e.keys
	if kc == nil { // CheckCommand's engine: nothing to share
		return e.newOrgKeys(org, per)
	}
	sh := kc.shards[maphash.String(keySeed, org)%uint64(len(kc.shards))]
	k := orgPeriod{org, per.ID}
	if v, ok := sh.Get(k); ok {
		kc.hooks.Hit()
		return v
	}
	kc.hooks.Miss()
	v := e.newOrgKeys(org, per)
	if prev, found, _ := sh.PeekOrAdd(k, v); found { // another check added it meanwhile
		return prev
	}
	return v
}

// orgKeys are the EVALSHA arguments every check of one org in one period shares,
// already converted to interface values: building and boxing them per check was a
// third of the engine's allocations.
type orgKeys struct {
	tag          string
	month, dirty any
	index        any   // the dirty-org index (dirtyorgs.go)
	expire       int64 // unix s, when the month keys expire
	endMs        int64 // the period's end
	// the current and previous bucket keys of each sliding window, renamed when a
	// bucket ends (by position in slidingWindows)
	buckets [len(slidingWindows)]atomic.Pointer[bucketKeys]
	// the org's counter field of the metric last checked
	orgField atomic.Pointer[metricField]
}

type metricField struct {
	metric string
	field  any
}

// field returns the org's counter field of metric, boxed once.
func (k *orgKeys) field(metric string) any {
	if f := k.orgField.Load(); f != nil && f.metric == metric {
		return f.field
	}
	f := &metricField{metric: metric, field: metric + "|o"}
	k.orgField.Store(f)
	return f.field
}

// bucketKeys names the current and previous bucket of one sliding window.
type bucketKeys struct {
	n, ms     int64 // bucket number (unix ms / ms), window length in ms
	cur, prev any
}

// bucket returns the keys of window w (at position i in slidingWindows) at nowMs.
func (k *orgKeys) bucket(i int, w vocab.Window, nowMs int64) *bucketKeys {
	ms := w.Duration().Milliseconds()
	n := nowMs / ms
	if bk := k.buckets[i].Load(); bk != nil && bk.n == n {
		return bk
	}
	start := k.tag + "w|" + windowSeconds(w) + "|"
	bk := &bucketKeys{n: n, ms: ms, cur: start + strconv.FormatInt(n, 10), prev: start + strconv.FormatInt(n-1, 10)}
	k.buckets[i].Store(bk)
	return bk
}

// newOrgKeys builds the shared arguments of org's checks in per.
func (e *Engine) newOrgKeys(org string, per vocab.Period) *orgKeys {
	tag := orgTag(e.cfg.KeyPrefix, org)
	return &orgKeys{tag: tag, month: tag + "m|" + per.ID, dirty: tag + "d|" + per.ID, index: e.indexKey(org),
		expire: per.End.Add(e.cfg.MonthRetention).Unix(), endMs: per.End.UnixMilli()}
}
