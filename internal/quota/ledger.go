package quota

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// DrainDirty takes the month counters of org that changed in period (an ID such as
// "2026-11") since the last drain, with their current values. A counter that
// changes afterwards is marked dirty again. The caller owns the values: if it
// cannot persist them it must fall back to MonthUsage, which reads all of them.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails (the
// counters taken by the chunks already drained are returned with the error).
func (e *Engine) DrainDirty(ctx context.Context, org, period string) (map[Counter]int64, error) {
	if err := validOrgPeriod(org, period); err != nil {
		return nil, err
	}
	const chunk = 1000
	tag := orgTag(e.cfg.KeyPrefix, org)
	keys := []string{tag + "d|" + period, tag + "m|" + period}
	out := map[Counter]int64{}
	for {
		vals, err := drainScript.Run(ctx, e.rdb, keys, chunk).StringSlice()
		if err != nil {
			return out, fmt.Errorf("drain %s %s: %w: %w", org, period, ErrUnavailable, err)
		}
		if err := addCounters(out, vals); err != nil {
			return out, err
		}
		if len(vals)/2 < chunk-1 { // -1: a chunk may have held the set's keeper member '|'
			return out, nil
		}
	}
}

// MonthUsage reads every month counter of org in period.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails.
func (e *Engine) MonthUsage(ctx context.Context, org, period string) (map[Counter]int64, error) {
	if err := validOrgPeriod(org, period); err != nil {
		return nil, err
	}
	key := orgTag(e.cfg.KeyPrefix, org) + "m|" + period
	out := map[Counter]int64{}
	var cursor uint64
	for {
		vals, next, err := e.rdb.HScan(ctx, key, cursor, "", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("month usage %s %s: %w: %w", org, period, ErrUnavailable, err)
		}
		for i := 0; i+1 < len(vals); i += 2 {
			if vals[i] == markerField {
				vals[i], vals[i+1] = vals[len(vals)-2], vals[len(vals)-1]
				vals = vals[:len(vals)-2]
				break
			}
		}
		if err := addCounters(out, vals); err != nil {
			return nil, err
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

func addCounters(out map[Counter]int64, vals []string) error {
	for i := 0; i+1 < len(vals); i += 2 {
		c, err := parseField(vals[i])
		if err != nil {
			return err
		}
		v, err := strconv.ParseInt(vals[i+1], 10, 64)
		if err != nil {
			return fmt.Errorf("quota: counter %q: %w", vals[i], err)
		}
		out[c] = v
	}
	return nil
}

func validOrgPeriod(org, period string) error {
	if !validID(org) {
		return fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	if _, err := time.Parse("2006-01", period); err != nil || len(period) != 7 {
		return fmt.Errorf("%w: period %q is not YYYY-MM", ErrInvalid, period)
	}
	return nil
}
