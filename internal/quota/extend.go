package quota

import (
	"context"
	_ "embed"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Concurrency (vocab.Concurrent): Extend, the heartbeat that keeps a long holder's
// reservation open, and InFlight, the units held at once per counter.

var (
	//go:embed scripts/extend.lua
	extendSrc    string
	extendScript = redis.NewScript(extendSrc)
)

// Extend moves the expiry of held reservation id of org to now + ttl (1 ms to
// MaxReservationTTL): a heartbeat for work longer than the reservation's TTL, such as a
// stream holding a concurrency slot. The new expiry is persisted with the record by
// the next drain. anchorDay is the org's billing anchor day.
//
// Errors: ErrInvalid for a bad ttl; ErrReservationNotFound; *StateError once it is
// settled (a reservation already past its expiry is settled by its on_expiry first,
// and answers Expired); ErrUnavailable, ErrNotHydrated and context errors as Check.
func (e *Engine) Extend(ctx context.Context, org string, anchorDay int, id string, ttl time.Duration) (vocab.Reservation, error) {
	if ttl < time.Millisecond || ttl > MaxReservationTTL {
		return vocab.Reservation{}, fmt.Errorf("%w: reservation ttl %s is outside 1ms..%s", ErrInvalid, ttl, MaxReservationTTL)
	}
	if !vocab.ValidID(org) || !ValidReservationID(id) {
		return vocab.Reservation{}, fmt.Errorf("reservation %q: %w", id, ErrReservationNotFound)
	}
	select {
	case <-e.closing:
		return vocab.Reservation{}, ErrClosed
	default:
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	for hydrated := false; ; hydrated = true {
		now := e.Now()
		per := e.periodAt(now, anchorDay)
		expires := now.UnixMilli() + ttl.Milliseconds()
		keys := []string{tag + "x", tag + "rd", tag + "m|" + per.ID, tag + "r|" + id, e.indexKey(org)}
		reply, err := extendScript.Run(ctx, e.rdb, keys, now.UnixMilli(), expires,
			expires/1000+int64(recordRetention/time.Second), id).Text()
		if err != nil {
			return vocab.Reservation{}, checkError(err)
		}
		switch {
		case reply == "H" && !hydrated:
			if err := e.hydrate(ctx, org, per); err != nil {
				return vocab.Reservation{}, err
			}
			continue
		case reply == "H", reply == "N":
			return vocab.Reservation{}, fmt.Errorf("reservation %s: %w", id, ErrReservationNotFound)
		case reply == "X":
			// Past its expiry: its on_expiry settles it now (as the sweep would), so the
			// answer is the state it ends in, exactly once whoever settles.
			_, err := e.settle(ctx, org, anchorDay, id, ActionRelease, 0, false)
			if err == nil {
				err = &StateError{ID: id, State: vocab.Released} // unreachable: a due record settles as expired
			}
			return vocab.Reservation{}, err
		case strings.HasPrefix(reply, "S"):
			return vocab.Reservation{}, &StateError{ID: id, State: vocab.ReservationState(reply[1:])}
		case reply != "OK":
			return vocab.Reservation{}, fmt.Errorf("%w: extend reply %q", ErrBadReply, reply)
		}
		return e.Reservation(ctx, org, anchorDay, id)
	}
}

// InFlight returns the units held at once by open reservations that charged a
// concurrent limit (KEYS.md "Concurrency"), per counter of org; counters with nothing
// in flight are absent. It reads one hash: no period, no hydration (after Redis lost
// its data the hash is rebuilt by the hydration the next reservation or settlement
// runs).
//
// Errors: ErrInvalid for a bad org; ErrUnavailable when Redis fails.
func (e *Engine) InFlight(ctx context.Context, org string) (map[Counter]int64, error) {
	if !vocab.ValidID(org) {
		return nil, fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	h, err := e.rdb.HGetAll(ctx, orgTag(e.cfg.KeyPrefix, org)+"c").Result()
	if err != nil {
		return nil, checkError(err)
	}
	out := make(map[Counter]int64, len(h))
	for f, v := range h {
		c, err := parseField(f)
		if err != nil {
			continue
		}
		var n int64
		if _, err := fmt.Sscan(v, &n); err != nil || n <= 0 {
			continue
		}
		out[c] = n
	}
	return out, nil
}
