package quota

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Page sizes of OpenReservations.
const (
	// DefaultOpenPage is the page size when none is asked for.
	DefaultOpenPage = 50
	// MaxOpenPage is the largest page OpenReservations answers.
	MaxOpenPage = 100
	// openScanMax bounds the ids of the open set one call looks at: with a filter that
	// few reservations match, a page may then end short, with a cursor to go on from.
	openScanMax = 1000
	// openFilteredBatch is how many ids a filtered call reads per round trip.
	openFilteredBatch = 128
)

// OpenFilter narrows OpenReservations to a team and a user ("" for any).
type OpenFilter struct {
	Team, User string
}

// OpenCursor is where a page of OpenReservations starts: after the reservation of
// ExpiresAt (Unix ms, the open set's score) and ID. The zero cursor is the start.
type OpenCursor struct {
	ExpiresAt int64
	ID        string
}

// IsZero reports whether c is the start (or, returned, that there is no next page).
func (c OpenCursor) IsZero() bool { return c.ID == "" }

// OpenReservations reads one page of org's open (held) reservations in expiry order
// (ties by id), after the cursor, at most limit of them (DefaultOpenPage when 0). It
// reads the open set `x` (ids by expires_at) and each record in one pipeline per round
// trip; leases (IsLease) and records no longer held (settled since the set was read)
// are skipped. next is the cursor of the next page, zero on the last. When Redis has
// lost the org's keys it hydrates first, as Reservation does (anchorDay: the org's
// billing anchor day). A page looks at no more than 1,000 ids: one whose filter few
// reservations match may be short (even empty) and still have a next cursor.
//
// Errors: ErrInvalid for a bad org, filter, cursor or limit; ErrUnavailable when Redis
// fails; ErrNotHydrated.
func (e *Engine) OpenReservations(ctx context.Context, org string, anchorDay int, f OpenFilter, after OpenCursor, limit int) ([]vocab.Reservation, OpenCursor, error) {
	switch {
	case !vocab.ValidID(org):
		return nil, OpenCursor{}, fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	case f.Team != "" && !vocab.ValidID(f.Team), f.User != "" && !vocab.ValidID(f.User):
		return nil, OpenCursor{}, fmt.Errorf("%w: team or user is not a valid id", ErrInvalid)
	case !after.IsZero() && (!validRecordID(after.ID) || after.ExpiresAt < 0):
		return nil, OpenCursor{}, fmt.Errorf("%w: cursor %d/%q is not one this engine returned", ErrInvalid, after.ExpiresAt, after.ID)
	case limit < 0 || limit > MaxOpenPage:
		return nil, OpenCursor{}, fmt.Errorf("%w: page size %d is outside 1..%d", ErrInvalid, limit, MaxOpenPage)
	case limit == 0:
		limit = DefaultOpenPage
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	batch := limit + 1
	if f != (OpenFilter{}) {
		batch = openFilteredBatch
	}
	var out []vocab.Reservation
	pos, off, seen := after, 0, 0
	for hydrated := false; ; {
		start := "-inf"
		if !pos.IsZero() {
			start = strconv.FormatInt(pos.ExpiresAt, 10)
		}
		n := min(batch, openScanMax-seen)
		pipe := e.rdb.Pipeline()
		var marker *redis.BoolCmd
		if !hydrated && seen == 0 && off == 0 {
			marker = pipe.HExists(ctx, tag+"m|"+e.periodAt(e.Now(), anchorDay).ID, markerField)
		}
		ids := pipe.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: tag + "x", Start: start, Stop: "+inf",
			ByScore: true, Offset: int64(off), Count: int64(n)})
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, OpenCursor{}, fmt.Errorf("open reservations of %s: %w", org, checkError(err))
		}
		if marker != nil && !marker.Val() {
			if err := e.hydrate(ctx, org, e.periodAt(e.Now(), anchorDay)); err != nil {
				return nil, OpenCursor{}, err
			}
			hydrated = true
			continue
		}
		hydrated = true
		zs := ids.Val()
		// Ids at the cursor's own expiry up to its id were on an earlier page.
		var todo []redis.Z
		for _, z := range zs {
			id, _ := z.Member.(string)
			if !pos.IsZero() && int64(z.Score) == pos.ExpiresAt && id <= pos.ID {
				continue
			}
			todo = append(todo, z)
		}
		if len(todo) == 0 {
			if len(zs) < n {
				return out, OpenCursor{}, nil // the end of the set
			}
			off += len(zs) // a run of ties at the cursor's expiry longer than a batch
			continue
		}
		off = 0
		pipe = e.rdb.Pipeline()
		recs := make([]*redis.MapStringStringCmd, len(todo))
		for i, z := range todo {
			if id, _ := z.Member.(string); ValidReservationID(id) {
				recs[i] = pipe.HGetAll(ctx, tag+"r|"+id)
			}
		}
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
			return nil, OpenCursor{}, fmt.Errorf("open reservations of %s: %w", org, checkError(err))
		}
		for i, z := range todo {
			id, _ := z.Member.(string)
			seen++
			if recs[i] == nil { // a lease, or nothing a reservation could be
				pos = OpenCursor{ExpiresAt: int64(z.Score), ID: id}
				continue
			}
			h := recs[i].Val()
			if len(h) == 0 { // settled and gone since the set was read
				pos = OpenCursor{ExpiresAt: int64(z.Score), ID: id}
				continue
			}
			r, err := recordOf(org, id, h)
			if err != nil {
				return nil, OpenCursor{}, err
			}
			if r.State == vocab.Held && (f.Team == "" || r.Team == f.Team) && (f.User == "" || r.User == f.User) {
				if len(out) == limit {
					return out, pos, nil // one more exists: the page ends at the last one kept
				}
				out = append(out, r)
			}
			pos = OpenCursor{ExpiresAt: int64(z.Score), ID: id}
		}
		switch {
		case len(zs) < n:
			return out, OpenCursor{}, nil
		case seen >= openScanMax:
			return out, pos, nil
		}
	}
}
