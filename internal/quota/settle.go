package quota

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Settlements of reservations: Commit, Release and the script run they share
// (scripts/settle.lua), which the expiry sweep (sweep.go) runs too.

// Action is how Settle settles a held reservation.
type Action string

// The settlement actions.
const (
	ActionCommit  Action = "commit"
	ActionRelease Action = "release"
)

// Commit settles reservation id of org: used units are counted and amount - used given
// back at every level, in the month counters and the sliding-window buckets they were
// taken from (a bucket already out of its window is left alone). used above the amount
// is counted in full and reported as OverReserved. A repeated commit returns the first
// answer and counts nothing. anchorDay is the org's billing anchor day.
//
// Errors: ErrInvalid for bad arguments; ErrReservationNotFound; *StateError when it
// was released or expired (a reservation past its expiry is expired, whoever asks
// first); ErrUnavailable, ErrNotHydrated, ErrClosed and context errors as Check.
func (e *Engine) Commit(ctx context.Context, org string, anchorDay int, id string, used int64) (vocab.Reservation, error) {
	if used < 0 || used > vocab.MaxUnits {
		return vocab.Reservation{}, fmt.Errorf("%w: used %d is outside 0..%d", ErrInvalid, used, vocab.MaxUnits)
	}
	return e.settle(ctx, org, anchorDay, id, ActionCommit, used, false)
}

// CommitUsed is Commit with used units per metric, for a reservation of one metric or
// several (Reserve with Request.More): a metric left out used 0. Errors: Commit's, and
// ErrInvalid for a metric the reservation does not hold (nothing is settled then).
func (e *Engine) CommitUsed(ctx context.Context, org string, anchorDay int, id string, used map[string]int64) (vocab.Reservation, error) {
	metrics := make([]string, 0, len(used))
	for m, u := range used {
		if !vocab.ValidID(m) {
			return vocab.Reservation{}, fmt.Errorf("%w: metric %q is not a valid id", ErrInvalid, m)
		}
		if u < 0 || u > vocab.MaxUnits {
			return vocab.Reservation{}, fmt.Errorf("%w: used %d of %s is outside 0..%d", ErrInvalid, u, m, vocab.MaxUnits)
		}
		metrics = append(metrics, m)
	}
	if len(metrics) == 0 || len(metrics) > MaxMetrics+1 { // a priced reservation also holds its spend
		return vocab.Reservation{}, fmt.Errorf("%w: used must name 1 to %d metrics", ErrInvalid, MaxMetrics+1)
	}
	slices.Sort(metrics)
	var b strings.Builder
	for i, m := range metrics {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m)
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(used[m], 10))
	}
	return e.settle(ctx, org, anchorDay, id, ActionCommit, b.String(), false)
}

// Release gives all of reservation id back. A repeated release returns the first
// answer. Errors: those of Commit (*StateError when committed or expired).
func (e *Engine) Release(ctx context.Context, org string, anchorDay int, id string) (vocab.Reservation, error) {
	return e.settle(ctx, org, anchorDay, id, ActionRelease, 0, false)
}

// settle settles reservation id; a lease's settlement (lease true) is not reported as
// a reservation's and returns without reading the record back.
// used is a number, or settle.lua's "metric=used,..." (CommitUsed).
func (e *Engine) settle(ctx context.Context, org string, anchorDay int, id string, act Action, used any, lease bool) (vocab.Reservation, error) {
	if !vocab.ValidID(org) {
		return vocab.Reservation{}, fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	if lease && !IsLease(id) || !lease && !ValidReservationID(id) {
		return vocab.Reservation{}, fmt.Errorf("reservation %q: %w", id, ErrReservationNotFound)
	}
	select {
	case <-e.closing:
		return vocab.Reservation{}, ErrClosed
	default:
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	c := e.getCall()
	defer func() {
		if c != nil {
			e.putCall(c)
		}
	}()
	var a attempt
	for hydrated := false; ; {
		now := e.Now()
		per := e.periodAt(now, anchorDay)
		// Through the batching loop, as checks: concurrent settlements share pipelines.
		c.org, c.period, c.src = org, per, settleSrc
		c.args = append(c.args[:0], "evalsha", settleSHA, 5, tag+"x", tag+"rd", tag+"m|"+per.ID, tag+"r|"+id, e.indexKey(org),
			string(act), now.UnixMilli(), used, id)
		if c.ask != "" {
			e.sendAsking(ctx, c)
		} else if err := e.submit(ctx, c); err != nil {
			c = nil // may still be owned by the loop: not recycled
			return vocab.Reservation{}, err
		}
		_, v, pause, err := e.next(c, &a)
		if err != nil {
			return vocab.Reservation{}, err
		}
		if v == resend {
			if err := e.sleep(ctx, pause); err != nil {
				return vocab.Reservation{}, err
			}
			continue
		}
		reply := c.reply
		switch {
		case reply == "H" && !hydrated:
			if err := e.hydrate(ctx, org, per); err != nil {
				return vocab.Reservation{}, err
			}
			hydrated = true
			continue
		case reply == "H", reply == "N":
			return vocab.Reservation{}, fmt.Errorf("reservation %s: %w", id, ErrReservationNotFound)
		case strings.HasPrefix(reply, "U"):
			if reply == "U" {
				return vocab.Reservation{}, fmt.Errorf("%w: reservation %s holds several metrics: used must name them", ErrInvalid, id)
			}
			return vocab.Reservation{}, fmt.Errorf("%w: reservation %s holds no metric %s", ErrInvalid, id, reply[1:])
		case strings.HasPrefix(reply, "S"):
			return vocab.Reservation{}, &StateError{ID: id, State: vocab.ReservationState(reply[1:])}
		}
		replay := strings.HasPrefix(reply, "R")
		if replay {
			reply = reply[1:]
		}
		r := vocab.Reservation{ID: id, Org: org, Replayed: replay}
		if err := parseAnswer(&r, reply); err != nil {
			return vocab.Reservation{}, err
		}
		if !replay && !lease {
			e.settled(&r)
		}
		if r.State == vocab.Expired { // it expired before this call came: its expiry settled it
			return vocab.Reservation{}, &StateError{ID: id, State: vocab.Expired}
		}
		return r, nil
	}
}

// parseAnswer reads settle.lua's answer: state;amount;used;released;over;settled_ms;
// expires_ms;on_expiry;period;first counter field;last counter field, and for several
// metrics ";metric=amount/used/released/over,...".
func parseAnswer(r *vocab.Reservation, s string) error {
	p := strings.Split(s, ";")
	if len(p) != 11 && len(p) != 12 {
		return fmt.Errorf("quota: malformed settlement %q", s)
	}
	if len(p) == 12 {
		r.Metrics = r.Metrics[:0]
		for _, m := range strings.Split(p[11], ",") {
			name, nums, ok := strings.Cut(m, "=")
			f := strings.Split(nums, "/")
			if !ok || len(f) != 4 {
				return fmt.Errorf("quota: malformed settlement %q", s)
			}
			var n [4]int64
			for i := range n {
				v, err := strconv.ParseInt(f[i], 10, 64)
				if err != nil {
					return fmt.Errorf("quota: malformed settlement %q", s)
				}
				n[i] = v
			}
			r.Metrics = append(r.Metrics, vocab.MetricAmount{Metric: name, Amount: n[0], Used: n[1], Released: n[2], OverReserved: n[3]})
		}
		p = p[:11]
	}
	var n [6]int64
	for i := range n {
		v, err := strconv.ParseInt(p[i+1], 10, 64)
		if err != nil {
			return fmt.Errorf("quota: malformed settlement %q", s)
		}
		n[i] = v
	}
	r.State = vocab.ReservationState(p[0])
	r.Amount, r.Used, r.Released, r.OverReserved = n[0], n[1], n[2], n[3]
	r.SettledAt, r.ExpiresAt = time.UnixMilli(n[4]).UTC(), time.UnixMilli(n[5]).UTC()
	r.OnExpiry, r.Period = vocab.OnExpiry(p[7]), p[8]
	first, err1 := parseField(p[9])
	last, err2 := parseField(p[10])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("quota: malformed settlement %q", s)
	}
	r.Metric, r.Team, r.User = first.Metric, last.Team, last.User
	return nil
}

// settled reports a settlement this engine made to Config.OnReservation.
func (e *Engine) settled(r *vocab.Reservation) {
	if f := e.cfg.OnReservation; f != nil && !IsLease(r.ID) { // a lease was never reported opened
		f(ReservationEvent{State: r.State, OverReserved: r.OverReserved})
	}
}
