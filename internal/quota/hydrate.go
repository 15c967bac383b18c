package quota

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Hydrator supplies the durable month usage of an org when Redis has no counters for
// a period: after Redis restarted empty or failed over, and at the start of every
// period. The engine then restores each counter to max(in Redis, stored) and marks
// the period live, in one script, before deciding the check that found it missing.
//
// StoredUsage returns the last persisted value of each month counter of org in
// period (nil or empty when there is none). Any error it returns fails the waiting
// checks with an error wrapping ErrNotHydrated; nothing is counted meanwhile.
type Hydrator interface {
	StoredUsage(ctx context.Context, org string, period vocab.Period) (map[Counter]int64, error)
}

// ReservationHydrator is a Hydrator that also keeps reservations: hydration restores
// the ones StoredReservations returns (those of org in period as last persisted), the
// held ones with their units, along with the counters.
type ReservationHydrator interface {
	Hydrator
	StoredReservations(ctx context.Context, org string, period vocab.Period) ([]ReservationRecord, error)
}

// HydratorFunc adapts a function to Hydrator.
type HydratorFunc func(ctx context.Context, org string, period vocab.Period) (map[Counter]int64, error)

// StoredUsage calls f.
func (f HydratorFunc) StoredUsage(ctx context.Context, org string, period vocab.Period) (map[Counter]int64, error) {
	return f(ctx, org, period)
}

// hydrate restores org's counters for per once, however many checks ask at once.
func (e *Engine) hydrate(ctx context.Context, org string, per vocab.Period) error {
	_, err, _ := e.flight.Do(org+"|"+per.ID, func() (any, error) {
		e.lost.Add(1) // the org's keys were missing: so may the reserving set be (markReserving)
		// Shared by every waiting check: not cancelled by the first one giving up.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.HydrateTimeout)
		defer cancel()
		var usage map[Counter]int64
		if e.cfg.Hydrator != nil {
			var err error
			if usage, err = e.cfg.Hydrator.StoredUsage(ctx, org, per); err != nil {
				return nil, fmt.Errorf("hydrate %s %s: %w: %w", org, per.ID, ErrNotHydrated, err)
			}
		}
		var recs []ReservationRecord
		if rh, ok := e.cfg.Hydrator.(ReservationHydrator); ok {
			var err error
			if recs, err = rh.StoredReservations(ctx, org, per); err != nil {
				return nil, fmt.Errorf("hydrate %s %s: %w: %w", org, per.ID, ErrNotHydrated, err)
			}
		}
		tag := orgTag(e.cfg.KeyPrefix, org)
		args := make([]any, 3, 3+2*len(usage)+len(recs))
		args[0], args[1] = per.End.Add(e.cfg.MonthRetention).Unix(), tag
		for c, v := range usage {
			if v <= 0 {
				continue
			}
			if !vocab.ValidID(c.Metric) || levelLetter(c.Level) == "" {
				return nil, fmt.Errorf("hydrate %s %s: %w: bad stored counter %+v", org, per.ID, ErrNotHydrated, c)
			}
			args = append(args, c.field(), min(v, MaxCounter)) // old data past the bound: at the bound
		}
		args[2] = len(args) - 3
		for _, r := range recs {
			f := maps.Clone(r.Fields)
			f["id"] = r.ID
			js, err := json.Marshal(f)
			if err != nil {
				return nil, fmt.Errorf("hydrate %s %s: %w: %w", org, per.ID, ErrNotHydrated, err)
			}
			args = append(args, string(js))
		}
		keys := []string{tag + "m|" + per.ID, tag + "x", tag + "h|" + per.ID}
		n, err := hydrateScript.Run(ctx, e.rdb, keys, args...).Int()
		if err != nil {
			return nil, fmt.Errorf("hydrate %s %s: %w: %w: %w", org, per.ID, ErrNotHydrated, ErrUnavailable, err)
		}
		if n > 1 { // reservations restored: the sweep must see the org (the set may be lost too)
			if err := e.rdb.SAdd(ctx, e.reservingKey(), org).Err(); err != nil {
				return nil, fmt.Errorf("hydrate %s %s: %w: %w: %w", org, per.ID, ErrNotHydrated, ErrUnavailable, err)
			}
		}
		return nil, nil
	})
	return err
}
