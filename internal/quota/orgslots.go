package quota

import (
	"hash/maphash"
	"sync"
)

// orgSlotShards is the number of shards of an orgSlots table: no lock is global.
const orgSlotShards = 64

// orgSlots counts each org's checks in flight on this replica against a bound. An
// org has an entry only while it has a check in flight: its last check to end
// deletes it, so the table holds the orgs in flight (at most the checks in flight),
// not every org ever checked, and the live heap the garbage collector scans does not
// grow with the number of tenants.
type orgSlots struct {
	max    int64
	seed   maphash.Seed
	shards [orgSlotShards]orgSlotShard
}

type orgSlotShard struct {
	mu sync.Mutex
	n  map[string]int64
	_  [40]byte // a shard per cache line: shards hot on different cores do not share one
}

func newOrgSlots(max int) *orgSlots {
	s := &orgSlots{max: int64(max), seed: maphash.MakeSeed()}
	for i := range s.shards {
		s.shards[i].n = map[string]int64{}
	}
	return s
}

func (s *orgSlots) shard(org string) *orgSlotShard {
	return &s.shards[maphash.String(s.seed, org)%orgSlotShards]
}

// acquire takes one of org's slots, unless org already holds all of them.
func (s *orgSlots) acquire(org string) bool {
	sh := s.shard(org)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := sh.n[org]
	if n >= s.max {
		return false
	}
	sh.n[org] = n + 1
	return true
}

// release gives back one of org's slots, taken by acquire.
func (s *orgSlots) release(org string) {
	sh := s.shard(org)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if n := sh.n[org]; n > 1 {
		sh.n[org] = n - 1
	} else {
		delete(sh.n, org)
	}
}

// len is the number of orgs with a check in flight.
func (s *orgSlots) len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.n)
		sh.mu.Unlock()
	}
	return n
}
