package quota

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Reads of reservations: one reservation by id, and the units held per counter.
// Open reservations are listed by openlist.go.

// Reservation reads reservation id of org (anchorDay: the org's billing anchor day).
// When Redis has lost the org's keys it hydrates first, as a settlement does, so a
// reservation held when the worker last persisted is found.
//
// Errors: ErrReservationNotFound; ErrUnavailable when Redis fails; ErrNotHydrated.
func (e *Engine) Reservation(ctx context.Context, org string, anchorDay int, id string) (vocab.Reservation, error) {
	if !vocab.ValidID(org) || !ValidReservationID(id) {
		return vocab.Reservation{}, fmt.Errorf("reservation %q: %w", id, ErrReservationNotFound)
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	for hydrated := false; ; hydrated = true {
		h, err := e.rdb.HGetAll(ctx, tag+"r|"+id).Result()
		if err != nil {
			return vocab.Reservation{}, checkError(err)
		}
		if len(h) > 0 {
			return recordOf(org, id, h)
		}
		if hydrated {
			return vocab.Reservation{}, fmt.Errorf("reservation %s: %w", id, ErrReservationNotFound)
		}
		per := e.periodAt(e.Now(), anchorDay)
		live, err := e.rdb.HExists(ctx, tag+"m|"+per.ID, markerField).Result()
		if err != nil {
			return vocab.Reservation{}, checkError(err)
		}
		if live {
			return vocab.Reservation{}, fmt.Errorf("reservation %s: %w", id, ErrReservationNotFound)
		}
		if err := e.hydrate(ctx, org, per); err != nil {
			return vocab.Reservation{}, err
		}
	}
}

// recordOf decodes a reservation's record hash (scripts/reserve.lua).
func recordOf(org, id string, h map[string]string) (vocab.Reservation, error) {
	bad := func() (vocab.Reservation, error) {
		return vocab.Reservation{}, fmt.Errorf("quota: malformed reservation record %s", id)
	}
	r := vocab.Reservation{ID: id, Org: org, State: vocab.ReservationState(h["s"]), OnExpiry: vocab.OnExpiry(h["x"]), Period: h["p"]}
	num := func(k string) int64 {
		v, _ := strconv.ParseInt(h[k], 10, 64)
		return v
	}
	r.Amount = num("a")
	r.CreatedAt, r.ExpiresAt = time.UnixMilli(num("c")).UTC(), time.UnixMilli(num("e")).UTC()
	if f := h["f1"]; f != "" {
		c, err := parseField(f)
		if err != nil {
			return bad()
		}
		r.Metric = c.Metric
	}
	if f := h[fmt.Sprintf("f%d", num("nl"))]; f != "" {
		c, err := parseField(f)
		if err != nil {
			return bad()
		}
		r.Team, r.User = c.Team, c.User
	}
	if nm := num("nm"); nm > 1 { // several metrics (reserve.lua): each metric's amount
		nl := num("nl")
		r.Metrics = make([]vocab.MetricAmount, 0, nm)
		for m := int64(1); m <= nm; m++ {
			c, err := parseField(h[fmt.Sprintf("f%d", (m-1)*(nl/nm)+1)])
			if err != nil {
				return bad()
			}
			r.Metrics = append(r.Metrics, vocab.MetricAmount{Metric: c.Metric, Amount: num(fmt.Sprintf("a%d", m))})
		}
	}
	if ans := h["r"]; ans != "" {
		if err := parseAnswer(&r, ans); err != nil {
			return bad()
		}
	}
	return r, nil
}

// HeldUnits reads the units held by open reservations of org in period, per counter
// (the usage API's reserved). They are part of the month counters MonthUsage reads.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails.
func (e *Engine) HeldUnits(ctx context.Context, org, period string) (map[Counter]int64, error) {
	if err := validOrgPeriod(org, period); err != nil {
		return nil, err
	}
	h, err := e.rdb.HGetAll(ctx, orgTag(e.cfg.KeyPrefix, org)+"h|"+period).Result()
	if err != nil {
		return nil, fmt.Errorf("held units %s %s: %w: %w", org, period, ErrUnavailable, err)
	}
	out := make(map[Counter]int64, len(h))
	for f, v := range h {
		c, err := parseField(f)
		if err != nil {
			return nil, err
		}
		if n, _ := strconv.ParseInt(v, 10, 64); n > 0 {
			out[c] = n
		}
	}
	return out, nil
}
