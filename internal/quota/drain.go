package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// DrainDirty takes the month counters of org that changed in period (an ID such as
// "2026-11") since the last drain, with their committed values (the counter less the
// units held by open reservations, which never falls). A counter that changes
// afterwards is marked dirty again. The caller owns the values: if it cannot persist
// them it must fall back to MonthUsage, which reads all of them. It leaves changed
// reservations for Drain.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails (the
// counters taken by the chunks already drained are returned with the error).
func (e *Engine) DrainDirty(ctx context.Context, org, period string) (map[Counter]int64, error) {
	d, err := e.drain(ctx, org, period, false)
	return d.Counters, err
}

// Drained is what one Drain took: changed counters with their committed values, and
// the reservations of the period changed since the last drain, read in the same
// script runs, so that the two are one snapshot.
type Drained struct {
	Counters     map[Counter]int64
	Reservations []ReservationRecord
	// At is the engine's clock before the drain: every value was read at or after
	// it. The ledger keeps a value read before an operator's adjustment of its counter
	// (AdjustCounter) from raising the adjusted value back.
	At time.Time
}

// ReservationRecord is a reservation as drained for durable storage and restored by
// hydration: its record's fields (scripts/reserve.lua) as they were in Redis.
type ReservationRecord struct {
	ID        string
	Period    string
	State     vocab.ReservationState
	ExpiresAt time.Time
	Fields    map[string]string
}

// Drain is DrainDirty that also takes the reservations of period changed since the
// last drain. The caller must persist both together; if it cannot, it must read the
// counters with MonthUsage and give the reservations back with Undrain.
func (e *Engine) Drain(ctx context.Context, org, period string) (Drained, error) {
	return e.drain(ctx, org, period, true)
}

// Undrain marks reservations changed again, for the next Drain: their persistence failed.
func (e *Engine) Undrain(ctx context.Context, org string, recs []ReservationRecord) error {
	if len(recs) == 0 {
		return nil
	}
	ids := make([]any, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	if err := e.rdb.SAdd(ctx, orgTag(e.cfg.KeyPrefix, org)+"rd", ids...).Err(); err != nil {
		return fmt.Errorf("undrain %s: %w: %w", org, ErrUnavailable, err)
	}
	return nil
}

// drainChunk bounds the counters (and reservations) one run of drain.lua takes of
// each set.
const drainChunk = 1000

func (e *Engine) drain(ctx context.Context, org, period string, reservations bool) (Drained, error) {
	out := []DrainedPeriod{{Drained: Drained{Counters: map[Counter]int64{}, At: e.Now()}}}
	if err := validOrgPeriod(org, period); err != nil {
		return out[0].Drained, err
	}
	keys, args := e.drainArgs(org, []string{period}, reservations)
	for {
		reply, err := drainScript.Run(ctx, e.rdb, keys, args...).Slice()
		if err != nil {
			return out[0].Drained, fmt.Errorf("drain %s %s: %w: %w", org, period, ErrUnavailable, err)
		}
		more, err := addDrained(out, []string{period}, reply)
		if err != nil || !more {
			return out[0].Drained, err
		}
	}
}

// drainArgs are drain.lua's keys and arguments for org's periods.
func (e *Engine) drainArgs(org string, periods []string, reservations bool) ([]string, []any) {
	tag := orgTag(e.cfg.KeyPrefix, org)
	keys := make([]string, 0, 4*len(periods)+1)
	args := make([]any, 0, 3+len(periods))
	args = append(args, drainChunk, tag, len(periods))
	for _, p := range periods {
		wb, _ := e.recordKeys(wbOrg{org: org, period: p})
		keys = append(keys, tag+"d|"+p, tag+"m|"+p, tag+"h|"+p, wb)
		args = append(args, p)
	}
	if reservations {
		keys = append(keys, tag+"rd")
	}
	return keys, args
}

// addDrained adds one drain.lua reply for periods to outs (one each), and says whether
// the run took a full chunk of a set (it may hold more).
func addDrained(outs []DrainedPeriod, periods []string, reply []any) (more bool, err error) {
	strs := func(v any) []string {
		vs, _ := v.([]any)
		out := make([]string, len(vs))
		for i, x := range vs {
			out[i], _ = x.(string)
		}
		return out
	}
	if len(reply) < 2*len(periods) {
		return false, fmt.Errorf("quota: drain replied %d parts for %d periods", len(reply), len(periods))
	}
	for i := range periods {
		vals := strs(reply[2*i])
		if err := addCounters(outs[i].Counters, vals); err != nil {
			return false, err
		}
		// -1: a chunk may have held the set's keeper member '|'
		more = more || len(vals)/2 >= drainChunk-1
		if wb := strs(reply[2*i+1]); len(wb) == 2 {
			outs[i].WouldBlockEpoch = wb[0]
			outs[i].WouldBlockVersion, _ = strconv.ParseInt(wb[1], 10, 64)
		}
	}
	if len(reply) > 2*len(periods) {
		recs := strs(reply[2*len(periods)])
		for _, js := range recs {
			r, err := recordFromJSON(js)
			if err != nil {
				return false, err
			}
			for i, p := range periods {
				if p == r.Period {
					outs[i].Reservations = append(outs[i].Reservations, r)
				}
			}
		}
		more = more || len(recs) >= drainChunk
	}
	return more, nil
}

// OrgPeriod names one org's billing period.
type OrgPeriod struct{ Org, Period string }

// DrainedPeriod is what DrainMany took of one OrgPeriod: Drain's counters and
// reservations, the epoch and version of the period's would-block record (WouldBlockVersion),
// or the error of that period alone.
type DrainedPeriod struct {
	Drained
	WouldBlockEpoch   string
	WouldBlockVersion int64
	Err               error
}

// drainPipeline bounds the orgs of one pipeline of DrainMany: Redis runs a client's
// pipelined commands one after another, and 64 orgs' drains take a few ms of its
// time, so checks queued behind them wait no longer than that.
const drainPipeline = 64

// DrainMany is Drain and WouldBlockVersion of many periods: one run of drain.lua for
// the consecutive periods of one org, in pipelines of drainPipeline orgs, one round
// trip each (an org with more than one run's worth drains the rest period by period).
// Every Drained has the same At, taken before the first pipeline. Errors: a bad org
// or period is that entry's ErrInvalid; when Redis fails every entry not read has
// ErrUnavailable.
func (e *Engine) DrainMany(ctx context.Context, ps []OrgPeriod) []DrainedPeriod {
	out := make([]DrainedPeriod, len(ps))
	at := e.Now()
	type run struct{ from, to int } // ps[from:to], one org
	var runs []run
	for i, p := range ps {
		out[i].Drained = Drained{Counters: map[Counter]int64{}, At: at}
		if err := validOrgPeriod(p.Org, p.Period); err != nil {
			out[i].Err = err
			continue
		}
		if n := len(runs); n > 0 && runs[n-1].to == i && ps[runs[n-1].from].Org == p.Org {
			runs[n-1].to++
			continue
		}
		runs = append(runs, run{i, i + 1})
	}
	for len(runs) > 0 {
		batch := runs[:min(drainPipeline, len(runs))]
		runs = runs[len(batch):]
		cmds := make([]*redis.Cmd, len(batch))
		periodsOf := func(r run) []string {
			out := make([]string, 0, r.to-r.from)
			for _, p := range ps[r.from:r.to] {
				out = append(out, p.Period)
			}
			return out
		}
		send := func() error {
			_, err := e.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, r := range batch {
					keys, args := e.drainArgs(ps[r.from].Org, periodsOf(r), true)
					cmds[i] = p.EvalSha(ctx, drainScript.Hash(), keys, args...)
				}
				return nil
			})
			return err
		}
		err := send()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			if err = drainScript.Load(ctx, e.rdb).Err(); err == nil {
				err = send()
			}
		}
		if err != nil && !redis.HasErrorPrefix(err, "NOSCRIPT") {
			e.reloadOnDial(err)
		}
		for i, r := range batch {
			org, periods := ps[r.from].Org, periodsOf(r)
			reply, rerr := cmds[i].Slice()
			if rerr != nil {
				rerr = fmt.Errorf("%w: %w", ErrUnavailable, rerr)
			} else {
				var more bool
				if more, rerr = addDrained(out[r.from:r.to], periods, reply); rerr == nil && more {
					for j, p := range periods { // the rest, run by run
						rest, derr := e.drain(ctx, org, p, true)
						d := &out[r.from+j]
						for c, v := range rest.Counters {
							d.Counters[c] = v
						}
						d.Reservations = append(d.Reservations, rest.Reservations...)
						if derr != nil {
							d.Err = derr
						}
					}
					continue
				}
			}
			if rerr != nil {
				for j := r.from; j < r.to; j++ {
					out[j].Err = fmt.Errorf("drain %s %s: %w", org, ps[j].Period, rerr)
				}
			}
		}
	}
	return out
}

// recordFromJSON decodes a record as drain.lua encodes it.
func recordFromJSON(js string) (ReservationRecord, error) {
	var f map[string]string
	if err := json.Unmarshal([]byte(js), &f); err != nil {
		return ReservationRecord{}, fmt.Errorf("quota: malformed drained reservation: %w", err)
	}
	id := f["id"]
	delete(f, "id")
	exp, _ := strconv.ParseInt(f["e"], 10, 64)
	if !validRecordID(id) || f["p"] == "" || exp == 0 {
		return ReservationRecord{}, fmt.Errorf("quota: malformed drained reservation %q", id)
	}
	return ReservationRecord{ID: id, Period: f["p"], State: vocab.ReservationState(f["s"]), ExpiresAt: time.UnixMilli(exp).UTC(), Fields: f}, nil
}

// MonthUsage reads every month counter of org in period, as committed units: the
// counter less the units held by open reservations (HeldUnits), both read at once.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails.
func (e *Engine) MonthUsage(ctx context.Context, org, period string) (map[Counter]int64, error) {
	if err := validOrgPeriod(org, period); err != nil {
		return nil, err
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	var month, held *redis.MapStringStringCmd
	// One MULTI: the counters and the held units of one moment (a settlement in
	// between would make a give-back look committed).
	_, err := e.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		month = p.HGetAll(ctx, tag+"m|"+period)
		held = p.HGetAll(ctx, tag+"h|"+period)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("month usage %s %s: %w: %w", org, period, ErrUnavailable, err)
	}
	h := held.Val()
	out := map[Counter]int64{}
	vals := make([]string, 0, 2*len(month.Val()))
	for f, v := range month.Val() {
		if f == markerField {
			continue
		}
		if hv, ok := h[f]; ok {
			v = strconv.FormatInt(max(counterValue(v)-counterValue(hv), 0), 10)
		}
		vals = append(vals, f, v)
	}
	if err := addCounters(out, vals); err != nil {
		return nil, err
	}
	return out, nil
}

func addCounters(out map[Counter]int64, vals []string) error {
	for i := 0; i+1 < len(vals); i += 2 {
		c, err := parseField(vals[i])
		if err != nil {
			return err
		}
		out[c] = counterValue(vals[i+1])
	}
	return nil
}

// counterValue reads a stored counter as the scripts do, within 0..MaxCounter: a
// value stored out of range before the bound (old data) is read as MaxCounter, one
// that is not a number as 0 (the ledger only rises: nothing is lost by it), so one bad
// value never fails the flush of a whole org.
func counterValue(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		switch {
		case ferr != nil && !errors.Is(ferr, strconv.ErrRange), f != f:
			return 0
		case f >= float64(MaxCounter):
			return MaxCounter
		case f <= 0:
			return 0
		}
		n = int64(f)
	}
	return min(max(n, 0), MaxCounter)
}

func validOrgPeriod(org, period string) error {
	if !vocab.ValidID(org) {
		return fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	if _, err := time.Parse("2006-01", period); err != nil || len(period) != 7 {
		return fmt.Errorf("%w: period %q is not YYYY-MM", ErrInvalid, period)
	}
	return nil
}
