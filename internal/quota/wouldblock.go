package quota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Would-block records: how many checks of an org in Shadow or Warn mode would have
// been denied under Enforce, per limit (metric, level, id, window) and UTC day, and
// their units. They are counted in process after the decision (check.lua is not
// involved), added to Redis about once a second by scripts/wouldblock.lua, and
// persisted by the worker. KEYS.md has the layout; docs/ARCHITECTURE.md "Durability and billing" the bound.

// LevelOther is the level of the would-block row that counts everything beyond
// Config.WouldBlockCap distinct rows of an org in a period, so totals stay exact.
const LevelOther vocab.Level = "other"

// WouldBlockKey names one UTC day of one would-block row: the limit that would have
// denied the checks. The overflow row has Level LevelOther and nothing else but Day.
type WouldBlockKey struct {
	Day    string // YYYY-MM-DD, on the engine's clock (Redis TIME)
	Metric string
	Level  vocab.Level
	Team   string // for team and user rows
	User   string // for user rows
	Window vocab.Window
}

// WouldBlockCount is how many checks would have been denied, and their units.
type WouldBlockCount struct {
	Checks int64
	Units  int64
}

// WouldBlockRecord is an org's would-block record of one period as Redis holds it.
type WouldBlockRecord struct {
	// Epoch is set when the record's hash is created: a hash lost with Redis and
	// created again has another, so the worker keeps the counts of both apart.
	Epoch string
	// Version rises with every batch added; the record is at least as new as it.
	Version int64
	// Rows is the number of distinct rows, at most the cap; the overflow row aside.
	Rows   int
	Counts map[WouldBlockKey]WouldBlockCount
}

// wbOrg is one org's period: the unit of pending counts and of a batch.
type wbOrg struct{ org, period string }

// wbPending is what one replica counted for an org and period since its last batch.
type wbPending struct {
	endMs  int64 // the period's end: the record's expiry starts there
	counts map[WouldBlockKey]WouldBlockCount
}

// add counts n checks of units under k, or under the day's overflow row when k is
// new and the pending counts already hold limit rows (so memory stays bounded).
func (p *wbPending) add(k WouldBlockKey, c WouldBlockCount, limit int) {
	old, ok := p.counts[k]
	if !ok && len(p.counts) >= limit && k.Level != LevelOther {
		k = WouldBlockKey{Day: k.Day, Level: LevelOther}
		old = p.counts[k]
	}
	p.counts[k] = WouldBlockCount{Checks: old.Checks + c.Checks, Units: old.Units + c.Units}
}

type wbShard struct {
	mu   sync.Mutex
	orgs map[wbOrg]*wbPending
	_    [40]byte // keep shards on separate cache lines
}

// wbBatch is one org's pending counts as sent to Redis, kept until Redis confirms
// them: a batch is sent again, unchanged, until it is, and the script applies a
// sequence number once, so a lost reply neither loses nor doubles counts.
type wbBatch struct {
	keys []string
	args []any
}

// wouldBlocks is an engine's aggregator of would-block counts.
type wouldBlocks struct {
	limit   int
	replica string // random per engine: names its batch sequence in Redis
	seed    maphash.Seed
	shards  [16]wbShard
	day     atomic.Pointer[wbDay]

	mu      sync.Mutex // one flush at a time; guards what follows
	seq     int64
	carry   map[wbOrg]*wbPending // taken from the shards, waiting behind an unconfirmed batch
	unacked map[wbOrg]*wbBatch
}

type wbDay struct {
	n int64 // days since the epoch
	s string
}

func newWouldBlocks(limit int) *wouldBlocks {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &wouldBlocks{limit: limit, replica: hex.EncodeToString(b[:]), seed: maphash.MakeSeed(),
		carry: map[wbOrg]*wbPending{}, unacked: map[wbOrg]*wbBatch{}}
}

// dayOf is the UTC day of a clock in ms, formatted once per day.
func (w *wouldBlocks) dayOf(ms int64) string {
	n := ms / 86_400_000
	if d := w.day.Load(); d != nil && d.n == n {
		return d.s
	}
	d := &wbDay{n: n, s: time.UnixMilli(n * 86_400_000).UTC().Format(time.DateOnly)}
	w.day.Store(d)
	return d.s
}

// record counts c's check, which res says would have been denied.
func (w *wouldBlocks) record(c *call, b *vocab.Blocked) {
	req := &c.req
	k := WouldBlockKey{Day: w.dayOf(c.nowMs), Metric: req.Metric, Level: b.Level, Window: b.Window}
	if b.Metric != "" { // a multi-metric request's: the metric that would have blocked
		k.Metric = b.Metric
	}
	if b.Level != vocab.LevelOrg {
		k.Team = req.Team
	}
	if b.Level == vocab.LevelUser {
		k.User = req.User
	}
	o := wbOrg{org: c.org, period: c.period.ID}
	s := &w.shards[maphash.String(w.seed, o.org)%uint64(len(w.shards))]
	s.mu.Lock()
	p := s.orgs[o]
	if p == nil {
		if s.orgs == nil {
			s.orgs = map[wbOrg]*wbPending{}
		}
		p = &wbPending{endMs: c.period.End.UnixMilli(), counts: map[WouldBlockKey]WouldBlockCount{}}
		s.orgs[o] = p
	}
	p.add(k, WouldBlockCount{Checks: 1, Units: req.Cost}, w.limit)
	s.mu.Unlock()
}

// rowOf is k's row in the record hash.
func rowOf(k WouldBlockKey) string {
	switch k.Level {
	case vocab.LevelOrg:
		return k.Metric + "|" + string(k.Window) + "|o"
	case vocab.LevelTeam:
		return k.Metric + "|" + string(k.Window) + "|t|" + k.Team
	case vocab.LevelUser:
		return k.Metric + "|" + string(k.Window) + "|u|" + k.Team + "|" + k.User
	}
	return "*"
}

// parseRow is rowOf's inverse, Day aside.
func parseRow(s string) (WouldBlockKey, bool) {
	if s == "*" {
		return WouldBlockKey{Level: LevelOther}, true
	}
	p := strings.Split(s, "|")
	if len(p) < 3 {
		return WouldBlockKey{}, false
	}
	k := WouldBlockKey{Metric: p[0], Window: vocab.Window(p[1]), Level: levelOfLetter(p[2])}
	switch {
	case k.Level == vocab.LevelOrg && len(p) == 3:
	case k.Level == vocab.LevelTeam && len(p) == 4:
		k.Team = p[3]
	case k.Level == vocab.LevelUser && len(p) == 5:
		k.Team, k.User = p[3], p[4]
	default:
		return WouldBlockKey{}, false
	}
	return k, k.Window.Valid()
}

func (e *Engine) recordKeys(o wbOrg) (hash, seq string) {
	tag := orgTag(e.cfg.KeyPrefix, o.org)
	return tag + "b|" + o.period, tag + "s|" + e.wb.replica
}

// FlushWouldBlock adds the would-block counts gathered since the last flush to each
// org's record in Redis. The engine does so every Config.WouldBlockFlush and when it
// closes; tests call it to read what was counted so far. Counts Redis did not confirm
// stay in memory (bounded by Config.WouldBlockCap rows per org and period) and are
// sent again by the next flush.
//
// Errors: ErrUnavailable (joined, one per org and period) when Redis failed.
func (e *Engine) FlushWouldBlock(ctx context.Context) error {
	w := e.wb
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range w.shards {
		s := &w.shards[i]
		s.mu.Lock()
		taken := s.orgs
		s.orgs = nil
		s.mu.Unlock()
		for o, p := range taken {
			if c := w.carry[o]; c != nil {
				for k, n := range p.counts {
					c.add(k, n, w.limit)
				}
			} else {
				w.carry[o] = p
			}
		}
	}
	// Batches Redis has not confirmed go first, unchanged; an org's new counts follow
	// only once its batch before them is confirmed: sequence numbers only rise.
	var errs []error
	send := func(o wbOrg, b *wbBatch) bool {
		if err := wouldBlockScript.Run(ctx, e.rdb, b.keys, b.args...).Err(); err != nil {
			errs = append(errs, fmt.Errorf("would-block record of %s %s: %w: %w", o.org, o.period, ErrUnavailable, err))
			return false
		}
		delete(w.unacked, o)
		return true
	}
	for o, b := range w.unacked {
		send(o, b)
	}
	for o, p := range w.carry {
		if w.unacked[o] != nil {
			continue
		}
		w.seq++
		keys := make([]string, 3)
		keys[0], keys[1] = e.recordKeys(o)
		keys[2] = e.indexKey(o.org)
		ks := make([]WouldBlockKey, 0, len(p.counts))
		for k := range p.counts {
			ks = append(ks, k)
		}
		slices.SortFunc(ks, func(a, b WouldBlockKey) int { return strings.Compare(a.Day+rowOf(a), b.Day+rowOf(b)) })
		args := make([]any, 0, 4+4*len(ks))
		seq := strconv.FormatInt(w.seq, 10)
		args = append(args, w.limit, p.endMs+e.cfg.MonthRetention.Milliseconds(), w.replica+"-"+seq, seq)
		for _, k := range ks {
			n := p.counts[k]
			args = append(args, k.Day, rowOf(k), n.Checks, n.Units)
		}
		b := &wbBatch{keys: keys, args: args}
		w.unacked[o] = b
		delete(w.carry, o)
		send(o, b)
	}
	return errors.Join(errs...)
}

// wouldBlockLoop flushes the would-block counts at their interval, and once more when
// the engine closes, after its last pipeline.
func (e *Engine) wouldBlockLoop() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.WouldBlockFlush)
	defer t.Stop()
	for {
		select {
		case <-e.closing:
			<-e.stopped
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = e.FlushWouldBlock(ctx)
			cancel()
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = e.FlushWouldBlock(ctx) // kept and sent again next time
			cancel()
		}
	}
}

// WouldBlockVersion reads the epoch and version of org's record of period ("" and 0
// when there is none): the worker reads a record whole only when they changed.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails.
func (e *Engine) WouldBlockVersion(ctx context.Context, org, period string) (string, int64, error) {
	if err := validOrgPeriod(org, period); err != nil {
		return "", 0, err
	}
	key, _ := e.recordKeys(wbOrg{org: org, period: period})
	vals, err := e.rdb.HMGet(ctx, key, "e", "v").Result()
	if err != nil {
		return "", 0, fmt.Errorf("would-block record %s %s: %w: %w", org, period, ErrUnavailable, err)
	}
	epoch, _ := vals[0].(string)
	vs, _ := vals[1].(string)
	v, _ := strconv.ParseInt(vs, 10, 64)
	return epoch, v, nil
}

// WouldBlock reads org's would-block record of period from Redis (empty when there is
// none). It is read in chunks (HSCAN), so a batch added meanwhile may show in part:
// Version is the one read first, and the record holds at least what it says.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails or the
// record was replaced while read.
func (e *Engine) WouldBlock(ctx context.Context, org, period string) (WouldBlockRecord, error) {
	epoch, version, err := e.WouldBlockVersion(ctx, org, period)
	if err != nil || epoch == "" {
		return WouldBlockRecord{Counts: map[WouldBlockKey]WouldBlockCount{}}, err
	}
	rec := WouldBlockRecord{Epoch: epoch, Version: version, Counts: map[WouldBlockKey]WouldBlockCount{}}
	key, _ := e.recordKeys(wbOrg{org: org, period: period})
	var cursor uint64
	for {
		vals, next, err := e.rdb.HScan(ctx, key, cursor, "", 1000).Result()
		if err != nil {
			return WouldBlockRecord{}, fmt.Errorf("would-block record %s %s: %w: %w", org, period, ErrUnavailable, err)
		}
		for i := 0; i+1 < len(vals); i += 2 {
			f, v := vals[i], vals[i+1]
			switch {
			case f == "e":
				if v != epoch {
					return WouldBlockRecord{}, fmt.Errorf("would-block record %s %s: %w: replaced while read", org, period, ErrUnavailable)
				}
			case f == "n":
				rec.Rows, _ = strconv.Atoi(v)
			case len(f) > 2 && (f[0] == 'c' || f[0] == 'u') && f[1] == '|':
				day, row, _ := strings.Cut(f[2:], "|")
				k, ok := parseRow(row)
				n, err := strconv.ParseInt(v, 10, 64)
				if !ok || err != nil || len(day) != len(time.DateOnly) {
					return WouldBlockRecord{}, fmt.Errorf("quota: malformed would-block field %q", f)
				}
				k.Day = day
				c := rec.Counts[k]
				if f[0] == 'c' {
					c.Checks = n
				} else {
					c.Units = n
				}
				rec.Counts[k] = c
			}
		}
		if cursor = next; cursor == 0 {
			return rec, nil
		}
	}
}
