package quota

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

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

// popIndexSrc pops up to ARGV[1] members of the index KEYS[1], puts the sentinel back
// when it popped any (it may have been one of them), and records each org popped in
// the index's in-flight record KEYS[2] (inflightSuffix), scored by the pop's Redis
// time in ms, made larger than the org's previous score there so that a score names
// one pop: the worker removes the entry only with the score it popped (doneInFlightSrc),
// after the org's drained counters are written.
// Reply: flat pairs org, score.
const popIndexSrc = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local m = redis.call('SPOP', KEYS[1], ARGV[1])
if #m > 0 then
  redis.call('SADD', KEYS[1], '|')
  for _, o in ipairs(m) do
    if o ~= '|' then
      local s = now
      local prev = tonumber(redis.call('ZSCORE', KEYS[2], o))
      if prev and prev >= s then s = prev + 1 end
      redis.call('ZADD', KEYS[2], s, o)
      out[#out + 1] = o
      out[#out + 1] = string.format('%d', s)
    end
  end
end
return out`

// doneInFlightSrc removes from the in-flight record KEYS[1] each org of the pairs
// org, score in ARGV whose entry still has that score: a later pop of the org (by
// this worker or another) wrote a larger one, and its entry stays until that pop's
// write.
const doneInFlightSrc = `local n = 0
for i = 1, #ARGV, 2 do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and tonumber(s) == tonumber(ARGV[i + 1]) then
    n = n + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return n`

var doneInFlightSHA = func() string { return redis.NewScript(doneInFlightSrc).Hash() }()

// inflightSuffix ends every in-flight record key: a sorted set beside each dirty-org
// index, of the orgs popped whose drained counters are not known to be written.
const inflightSuffix = "|f"

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

// inflightKey names the in-flight record beside the index key ix.
func inflightKey(ix string) string { return strings.TrimSuffix(ix, indexSuffix) + inflightSuffix }

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

// DirtyOrg is an org taken by PopDirtyOrgs. Token is the score of its entry in the
// in-flight record, which DoneInFlight removes once its drained counters are written.
// Recover says the org came from that record, not from the index: a pop of it, by a
// worker that died or one still running, may have drained counters not yet written,
// so its periods must be read whole (MonthUsage).
type DirtyOrg struct {
	Org     string
	Token   int64
	Recover bool
}

// PopDirtyOrgs takes, atomically per index, the orgs that changed since the last pop:
// new month counter fields, changed reservations or would-block records; each is
// recorded in flight until DoneInFlight. With recoverAfter >= 0 it first reads, as
// Recover, the orgs recorded in flight for at least recoverAfter by the engine's clock
// (0: all of them). An org it returns must be drained (Drain, WouldBlockVersion) or
// given back (MarkDirtyOrgs); an org both recorded and popped is returned once, with
// the pop's Token and Recover set.
// Errors: ErrUnavailable when Redis fails (the orgs of the indexes read are returned).
func (e *Engine) PopDirtyOrgs(ctx context.Context, recoverAfter time.Duration) ([]DirtyOrg, error) {
	var out []DirtyOrg
	seen := map[string]int{}
	add := func(d DirtyOrg) {
		if at, ok := seen[d.Org]; ok {
			out[at].Token = max(out[at].Token, d.Token)
			out[at].Recover = out[at].Recover || d.Recover
			return
		}
		seen[d.Org] = len(out)
		out = append(out, d)
	}
	if recoverAfter >= 0 {
		if err := e.inFlight(ctx, e.Now().Add(-recoverAfter), add); err != nil {
			return out, err
		}
	}
	const chunk = 10_000
	keys := e.indexKeys()
	for len(keys) > 0 {
		if err := e.rdb.ScriptLoad(ctx, popIndexSrc).Err(); err != nil { // every primary: EVALSHA below
			e.reloadOnDial(err)
			return out, fmt.Errorf("pop dirty orgs: %w: %w", ErrUnavailable, err)
		}
		cmds := make([]*redis.Cmd, len(keys))
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				cmds[i] = p.EvalSha(ctx, popIndexSHA, []string{k, inflightKey(k)}, chunk)
			}
			return nil
		})
		var more []string
		for i, c := range cmds {
			vals, cerr := c.StringSlice()
			if cerr != nil && cerr != redis.Nil {
				continue
			}
			// The sentinel may have been popped: a full chunk is one short.
			if len(vals)/2 >= chunk-1 {
				more = append(more, keys[i])
			}
			for j := 0; j+1 < len(vals); j += 2 {
				if token, perr := strconv.ParseInt(vals[j+1], 10, 64); perr == nil && vocab.ValidID(vals[j]) {
					add(DirtyOrg{Org: vals[j], Token: token})
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

// inFlight calls add with every entry of the in-flight records scored at or before
// cutoff, as Recover.
func (e *Engine) inFlight(ctx context.Context, cutoff time.Time, add func(DirtyOrg)) error {
	const page = 10_000
	upTo := strconv.FormatInt(cutoff.UnixMilli(), 10)
	keys := e.indexKeys()
	for offset := int64(0); len(keys) > 0; offset += page {
		cmds := make([]*redis.ZSliceCmd, len(keys))
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range keys {
				cmds[i] = p.ZRangeByScoreWithScores(ctx, inflightKey(k), &redis.ZRangeBy{Min: "-inf", Max: upTo, Offset: offset, Count: page})
			}
			return nil
		})
		if err != nil && err != redis.Nil {
			e.reloadOnDial(err)
			return fmt.Errorf("in-flight record: %w: %w", ErrUnavailable, err)
		}
		var more []string
		for i, c := range cmds {
			zs := c.Val()
			for _, z := range zs {
				if org, ok := z.Member.(string); ok && vocab.ValidID(org) {
					add(DirtyOrg{Org: org, Token: int64(z.Score), Recover: true})
				}
			}
			if len(zs) == page {
				more = append(more, keys[i])
			}
		}
		keys = more
	}
	return nil
}

// DoneInFlight removes orgs from the in-flight record: their drained counters are
// written. An entry a later pop rewrote (another Token) stays. Errors: ErrUnavailable
// when Redis fails (the entries stay, and are read whole once old).
func (e *Engine) DoneInFlight(ctx context.Context, orgs []DirtyOrg) error {
	if len(orgs) == 0 {
		return nil
	}
	const chunk = 1000
	byKey := map[string][]any{}
	for _, o := range orgs {
		if vocab.ValidID(o.Org) && o.Token > 0 {
			k := inflightKey(e.indexKey(o.Org))
			byKey[k] = append(byKey[k], o.Org, o.Token)
		}
	}
	run := func() error {
		_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k, args := range byKey {
				for i := 0; i < len(args); i += 2 * chunk {
					p.EvalSha(ctx, doneInFlightSHA, []string{k}, args[i:min(i+2*chunk, len(args))]...)
				}
			}
			return nil
		})
		return err
	}
	err := run()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		if err = e.rdb.ScriptLoad(ctx, doneInFlightSrc).Err(); err == nil {
			err = run()
		}
	}
	if err != nil {
		e.reloadOnDial(err)
		return fmt.Errorf("in-flight record: %w: %w", ErrUnavailable, err)
	}
	return nil
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
