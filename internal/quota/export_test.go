package quota

import (
	"encoding/binary"
	"math"
	"time"
)

// CheckKeys lists every key one check of req touches when the engine's clock reads
// now: the KEYS of the EVALSHA the engine builds (month hash, dirty set, idempotency
// key; hydrate.lua and drain.lua use the first two), then the current and previous
// bucket of each sliding window, which the engine names in ARGV. It fails as New does
// for a bad prefix and as Check does for a bad request.
func CheckKeys(prefix string, req Request, now time.Time) ([]string, error) {
	args, err := CheckCommand(prefix, req, now)
	if err != nil {
		return nil, err
	}
	nkeys := args[2].(int)
	var keys []string
	for _, k := range args[3 : 3+nkeys] {
		keys = append(keys, k.(string))
	}
	argv := args[3+nkeys:]
	nums := argv[len(argv)-1].([]byte) // the last ARGV: nl and nw are its 6th and 7th numbers
	num := func(i int) int { return int(math.Float64frombits(binary.LittleEndian.Uint64(nums[8*i:]))) }
	nl, nw := num(5), num(6)
	for _, k := range argv[nl : nl+2*nw] {
		keys = append(keys, k.(string))
	}
	return keys, nil
}

// KeyCacheLen is the number of entries in e's key cache.
func KeyCacheLen(e *Engine) int { return e.keys.len() }

// LeasePaths is the number of paths e's leases keep state for.
func LeasePaths(e *Engine) int {
	e.leases.mu.RLock()
	defer e.leases.mu.RUnlock()
	return len(e.leases.paths)
}
