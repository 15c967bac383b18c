package quota

import (
	"hash/maphash"

	lru "github.com/hashicorp/golang-lru/v2"
)

// CacheHooks are told of an in-process cache's events, for metrics. Each func may be
// nil (nothing is told); they run on the checking goroutine and must not block.
type CacheHooks struct {
	Hit   func() // an entry was found
	Miss  func() // an entry was built and added
	Evict func() // an entry was dropped to make room (least recently used first)
}

// keyCacheShards is the most shards of an engine's key cache: the least recently used
// entry is evicted within its shard, and no lock is global.
const keyCacheShards = 64

// keyCache holds the shared EVALSHA arguments of each org and period (orgKeys),
// bounded in entries: hashicorp/golang-lru, one LRU per shard.
type keyCache struct {
	shards []*lru.Cache[orgPeriod, *orgKeys]
	hooks  CacheHooks
}

type orgPeriod struct{ org, period string }

var keySeed = maphash.MakeSeed()

// newKeyCache makes a cache of about size entries (at least size, less than size plus
// the number of shards).
func newKeyCache(size int, hooks CacheHooks) *keyCache {
	n := min(keyCacheShards, size)
	per := (size + n - 1) / n
	var onEvict func(orgPeriod, *orgKeys)
	if hooks.Evict != nil {
		onEvict = func(orgPeriod, *orgKeys) { hooks.Evict() }
	}
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
func (e *Engine) orgKeys(org string, per Period) *orgKeys {
	kc := e.keys
	if kc == nil { // CheckCommand's engine: nothing to share
		return e.newOrgKeys(org, per)
	}
	sh := kc.shards[maphash.String(keySeed, org)%uint64(len(kc.shards))]
	k := orgPeriod{org, per.ID}
	if v, ok := sh.Get(k); ok {
		if kc.hooks.Hit != nil {
			kc.hooks.Hit()
		}
		return v
	}
	if kc.hooks.Miss != nil {
		kc.hooks.Miss()
	}
	v := e.newOrgKeys(org, per)
	if prev, found, _ := sh.PeekOrAdd(k, v); found { // another check added it meanwhile
		return prev
	}
	return v
}
