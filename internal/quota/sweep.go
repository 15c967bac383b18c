package quota

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The expiry sweep: the reserving set of orgs it reads, and the settlement of every
// reservation past its expiry by its on_expiry.

// reservingKey is the set of orgs that have reserved on this Redis, which the sweep
// reads. Its hash tag "|reservations" is no org's: ids cannot contain '|'. In Cluster
// it is a slot of its own, so a reservation's script cannot add to it: Reserve adds
// the org first (once per engine), and hydration adds it again after Redis lost it.
func (e *Engine) reservingKey() string { return e.cfg.KeyPrefix + ":{|reservations}" }

// markReserving adds org to the reserving set, once per engine and loss of Redis
// data: after a Redis restart, a failover or a missing org (Engine.lost moved on) the
// set may have lost the org, and the sweep reads only the set, so a reservation made
// after a restart would otherwise stay held for ever.
func (e *Engine) markReserving(ctx context.Context, org string) error {
	lost := e.lost.Load()
	if v, ok := e.reserving.Load(org); ok && v.(uint64) == lost {
		return nil
	}
	if err := e.rdb.SAdd(ctx, e.reservingKey(), org).Err(); err != nil {
		return checkError(err)
	}
	e.reserving.Store(org, lost)
	return nil
}

// sweepBatch is the most reservations one script run expires.
const sweepBatch = 500

// ExpireDue settles every reservation of org past its expiry by its on_expiry, and
// returns them. Running it anywhere, any number of times at once, settles each once.
//
// Errors: ErrInvalid for a bad org; ErrUnavailable when Redis fails (those expired by
// the batches done are returned with the error).
func (e *Engine) ExpireDue(ctx context.Context, org string) ([]vocab.Reservation, error) {
	if !vocab.ValidID(org) {
		return nil, fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	keys := []string{tag + "x", tag + "rd", tag + "m|", e.indexKey(org)}
	var out []vocab.Reservation
	for {
		vals, err := settleScript.Run(ctx, e.rdb, keys, "sweep", e.Now().UnixMilli(), 0, "", tag, sweepBatch).StringSlice()
		if err != nil && !errors.Is(err, redis.Nil) {
			return out, fmt.Errorf("expire reservations of %s: %w", org, checkError(err))
		}
		for _, v := range vals {
			id, ans, _ := strings.Cut(v, ";")
			r := vocab.Reservation{ID: id, Org: org}
			if err := parseAnswer(&r, ans); err != nil {
				return out, err
			}
			e.settled(&r)
			out = append(out, r)
		}
		if len(vals) < sweepBatch {
			return out, nil
		}
	}
}

// SweepReservations runs ExpireDue for every org that has reserved on this engine's
// Redis and returns how many reservations it expired: the orgs of each page of the
// reserving set in one pipeline, so a sweep costs a round trip per 1,000 orgs. The
// worker runs it every ReservationSweep on every engine; several workers at once are
// safe.
func (e *Engine) SweepReservations(ctx context.Context) (int, error) {
	var n int
	var errs []error
	var cursor uint64
	for {
		orgs, next, err := e.rdb.SScan(ctx, e.reservingKey(), cursor, "", 1000).Result()
		if err != nil {
			return n, errors.Join(append(errs, checkError(err))...)
		}
		got, err := e.sweepPage(ctx, orgs)
		n += got
		if err != nil {
			errs = append(errs, err)
		}
		if cursor = next; cursor == 0 {
			return n, errors.Join(errs...)
		}
	}
}

// sweepPage sweeps orgs in one pipeline; an org with more due than one run expires,
// or whose script Redis did not know, is finished by ExpireDue.
func (e *Engine) sweepPage(ctx context.Context, orgs []string) (int, error) {
	now := e.Now().UnixMilli()
	cmds := make([]*redis.Cmd, len(orgs))
	pipe := e.rdb.Pipeline()
	for i, org := range orgs {
		if !vocab.ValidID(org) {
			continue
		}
		tag := orgTag(e.cfg.KeyPrefix, org)
		cmds[i] = settleScript.EvalSha(ctx, pipe, []string{tag + "x", tag + "rd", tag + "m|", e.indexKey(org)}, "sweep", now, 0, "", tag, sweepBatch)
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	var n int
	var errs []error
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		vals, err := cmd.StringSlice()
		switch {
		case err == nil:
			for _, v := range vals {
				id, ans, _ := strings.Cut(v, ";")
				r := vocab.Reservation{ID: id, Org: orgs[i]}
				if err := parseAnswer(&r, ans); err != nil {
					return n, err
				}
				e.settled(&r)
				n++
			}
			if len(vals) < sweepBatch {
				continue
			}
		case !redis.HasErrorPrefix(err, "NOSCRIPT"):
			errs = append(errs, fmt.Errorf("expire reservations of %s: %w", orgs[i], checkError(err)))
			continue
		}
		// More due than one run expires, or NOSCRIPT (ExpireDue's Run loads the script).
		got, err := e.ExpireDue(ctx, orgs[i])
		n += len(got)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}
