package quota

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The dirty-org index: every script that leaves something for the worker's flush (a
// counter field new in an org's dirty set, a changed reservation, a would-block batch)
// adds the org to a set in the same script run, so the flush pops the orgs with new
// usage instead of visiting every org. A Redis Cluster runs a script only on keys of
// one slot, so there the index is one set per slot, named with a tag of that slot
// (slotTags); on a single Redis it is one set. The worker takes the set with SPOP,
// atomically: an org that becomes dirty after that is in the set again for the next
// tick, and one popped is drained by the tick that popped it (or, when that fails, put
// back).

// indexSuffix ends every dirty-org index key.
const indexSuffix = "|o"

// indexSentinel is a member every index keeps once it exists, as the dirty set keeps
// "|": a pop that empties an index puts it back, so the key never disappears. On a
// Redis Cluster a check declares its slot's index among its keys, and while the slot
// migrates a multi-key command whose keys are not all present is refused (TRYAGAIN)
// until the migration ends: an index popped empty (most ticks) failed every check of
// the migrating slot's orgs (TestCluster: 1,481-1,629 of the busy org's checks).
const indexSentinel = "|"

// popIndexSrc pops up to ARGV[1] members of the index KEYS[1] and, when it popped
// any, puts the sentinel back (it may have been one of them).
const popIndexSrc = `local m = redis.call('SPOP', KEYS[1], ARGV[1])
if #m > 0 then redis.call('SADD', KEYS[1], '|') end
return m`

var popIndexSHA = func() string { return redis.NewScript(popIndexSrc).Hash() }()

// reloadOnDial refreshes a cluster's slot map after err, when err says a primary
// could not be reached (a failover): a pipeline does not refresh it by itself, and the
// index pops would dial the dead primary until the next check refreshed it.
func (e *Engine) reloadOnDial(err error) {
	if e.cluster != nil && classifyClusterError(err).reload {
		e.cluster.ReloadState(context.Background())
	}
}

// crc16 is CRC16-XMODEM (polynomial 0x1021, initial 0), Redis Cluster's key hash.
func crc16(b string) uint16 {
	var crc uint16
	for i := 0; i < len(b); i++ {
		crc ^= uint16(b[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is the Redis Cluster slot of a hash tag.
func keySlot(tag string) int { return int(crc16(tag)) % 16384 }

var (
	slotTagsOnce sync.Once
	slotTags     [16384]string // a short tag of each slot: "o" and a number
)

// slotTag returns a tag that hashes to slot: found once by trying "o0", "o1", ...
// (about 160,000 tries cover every slot; a few milliseconds).
func slotTag(slot int) string {
	slotTagsOnce.Do(func() {
		left := len(slotTags)
		for i := 0; left > 0; i++ {
			t := "o" + strconv.Itoa(i)
			if s := keySlot(t); slotTags[s] == "" {
				slotTags[s] = t
				left--
			}
		}
	})
	return slotTags[slot]
}

// indexKey names the dirty-org index that org's scripts add it to.
func (e *Engine) indexKey(org string) string {
	if e.slotted {
		return e.cfg.KeyPrefix + ":{" + slotTag(keySlot(org)) + "}" + indexSuffix
	}
	return e.cfg.KeyPrefix + ":" + indexSuffix
}

// indexKeys lists every dirty-org index of the engine's Redis.
func (e *Engine) indexKeys() []string {
	if !e.slotted {
		return []string{e.cfg.KeyPrefix + ":" + indexSuffix}
	}
	out := make([]string, 16384)
	for s := range out {
		out[s] = e.cfg.KeyPrefix + ":{" + slotTag(s) + "}" + indexSuffix
	}
	return out
}

// PopDirtyOrgs takes, atomically per index, the orgs that changed since the last pop:
// new month counter fields, changed reservations or would-block records. An org it
// returns must be drained (Drain, WouldBlockVersion) or given back (MarkDirtyOrgs).
// Errors: ErrUnavailable when Redis fails (the orgs of the indexes read are returned).
func (e *Engine) PopDirtyOrgs(ctx context.Context) ([]string, error) {
	const chunk = 10_000
	keys := e.indexKeys()
	seen := map[string]bool{}
	var out []string
	for len(keys) > 0 {
		if err := e.rdb.ScriptLoad(ctx, popIndexSrc).Err(); err != nil { // every primary: EVALSHA below
			e.reloadOnDial(err)
			return out, fmt.Errorf("pop dirty orgs: %w: %w", ErrUnavailable, err)
		}
		cmds := make([]*redis.Cmd, len(keys))
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				cmds[i] = p.EvalSha(ctx, popIndexSHA, []string{k}, chunk)
			}
			return nil
		})
		var more []string
		for i, c := range cmds {
			vals, cerr := c.StringSlice()
			if cerr != nil && cerr != redis.Nil {
				continue
			}
			if len(vals) == chunk {
				more = append(more, keys[i])
			}
			for _, o := range vals {
				if o == indexSentinel {
					continue
				}
				if !seen[o] {
					seen[o] = true
					out = append(out, o)
				}
			}
		}
		if err != nil && err != redis.Nil {
			e.reloadOnDial(err)
			return out, fmt.Errorf("pop dirty orgs: %w: %w", ErrUnavailable, err)
		}
		keys = more
	}
	return out, nil
}

// MarkDirtyOrgs puts orgs (back) into the dirty-org index: the next PopDirtyOrgs
// returns them. Errors: ErrUnavailable when Redis fails.
func (e *Engine) MarkDirtyOrgs(ctx context.Context, orgs ...string) error {
	_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, o := range orgs {
			if vocab.ValidID(o) {
				p.SAdd(ctx, e.indexKey(o), o)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("mark dirty orgs: %w: %w", ErrUnavailable, err)
	}
	return nil
}
