package quota

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Reservations (KEYS.md "Reservations"): Reserve holds units at every level of a
// check's path, decided by check.lua's own code; Commit, Release and the expiry sweep
// settle them with scripts/settle.lua, exactly once whoever comes first. This is the
// primitive of leases too: a Go caller reserves with its own TTL and settles with
// used <= amount, one script run each, without HTTP.
var (
	//go:embed scripts/reserve.lua
	reserveHead string
	//go:embed scripts/settle.lua
	settleSrc string

	reserveSrc       = composeReserve(checkSrc, reserveHead)
	reserveSHA   any = redis.NewScript(reserveSrc).Hash()
	settleScript     = redis.NewScript(settleSrc)
	settleSHA    any = settleScript.Hash()
)

// reserveHook is the line of check.lua that reserve.lua replaces.
const reserveHook = "local reserve, idem, idx, argc = false, KEYS[4], KEYS[3], #ARGV\n"

// composeReserve makes the reserve script: check.lua with reserve.lua in place of its
// hook line, so a reservation is decided by the check's code, not a copy of it.
func composeReserve(check, head string) string {
	if strings.Count(check, reserveHook) != 1 {
		panic("quota: scripts/check.lua must hold the reserve hook line exactly once: " + reserveHook)
	}
	return strings.Replace(check, reserveHook, head, 1)
}

// MaxReservationTTL is the longest a reservation may stay open. Its record is kept a
// day after it expires, for Reservation and for repeated settlements.
const MaxReservationTTL = 24 * time.Hour

// recordRetention is how long a reservation's record outlives its expiry.
const recordRetention = 24 * time.Hour

// leaseRecordRetention is how long a lease's record outlives its settlement
// (scripts/settle.lua, which has it as a literal): a hot path takes several leases a
// second, nobody reads a settled one back, and the drain only needs it until it runs.
// Unsettled (its replica died), it is kept as a reservation's is, for the sweep.
const leaseRecordRetention = 10 * time.Minute

// ReserveOptions says how long a reservation stays open and what settles it then.
type ReserveOptions struct {
	// TTL is how long the reservation stays open, up to MaxReservationTTL (default 60 s).
	TTL time.Duration
	// OnExpiry settles it when TTL passes unsettled (default ExpiryCommit).
	OnExpiry vocab.OnExpiry

	lease bool // a lease (lease.go): not reported as a reservation
}

// Errors of reservations.
var (
	// ErrReservationNotFound: no reservation of that id in the org (never made, another
	// org's, or its record expired a day after the reservation did).
	ErrReservationNotFound = derrors.New(derrors.NotFound, "reservation not found")
)

// StateError is returned when a reservation was already settled in another way than
// asked (a commit after a release or an expiry). It is a derrors.Conflict.
type StateError struct {
	ID    string
	State vocab.ReservationState
}

func (e *StateError) Error() string {
	return fmt.Sprintf("reservation %s is %s", e.ID, e.State)
}

// Kind is derrors.Conflict.
func (e *StateError) Kind() derrors.Kind { return derrors.Conflict }

// Is matches derrors.Conflict.
func (e *StateError) Is(target error) bool { return target == derrors.Conflict }

// newReservationID returns "r_" (a lease's: "l_") and 22 random base62 characters
// (about 131 bits).
func newReservationID(lease bool) string {
	const alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	var b [22]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	out := make([]byte, 2, 24)
	out[0], out[1] = 'r', '_'
	if lease {
		out[0] = 'l'
	}
	for _, c := range b {
		out = append(out, alphabet[int(c)%62]) // 256 % 62 = 8: a slight bias, still ~130 bits
	}
	return string(out)
}

// ValidReservationID reports whether id could be a reservation's id (a lease's is not
// one: leases are never seen through the API).
func ValidReservationID(id string) bool {
	return len(id) == 24 && id[0] == 'r' && validRecordID(id)
}

// IsLease reports whether a reservation record's id is a lease's: settled, its record
// is kept in Redis for leaseRecordRetention only and not at all in Postgres.
func IsLease(id string) bool {
	return len(id) == 24 && id[0] == 'l' && validRecordID(id)
}

// validRecordID reports whether id could be a reservation's or a lease's.
func validRecordID(id string) bool {
	if len(id) != 24 || id[0] != 'r' && id[0] != 'l' || id[1] != '_' {
		return false
	}
	for i := 2; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

func (o *ReserveOptions) validate() error {
	var errs []error
	if o.TTL == 0 {
		o.TTL = time.Minute
	}
	if o.TTL < time.Millisecond || o.TTL > MaxReservationTTL {
		errs = append(errs, fmt.Errorf("%w: reservation ttl %s is outside 1ms..%s", ErrInvalid, o.TTL, MaxReservationTTL))
	}
	switch o.OnExpiry {
	case "":
		o.OnExpiry = vocab.ExpiryCommit
	case vocab.ExpiryCommit, vocab.ExpiryRelease:
	default:
		errs = append(errs, fmt.Errorf("%w: on_expiry %q is not commit or release", ErrInvalid, o.OnExpiry))
	}
	return errors.Join(errs...)
}

// Reserve holds req.Cost units (> 0) of req.Metric at every level of req, decided
// exactly as Check decides a check of that cost: all or nothing over every limit of
// every level and window. Held units count against every limit as used units do until
// the reservation is settled (Commit, Release, or expiry by the sweep). A denied
// reservation holds nothing: Result.Allowed is false and the Reservation is zero.
// With req.IdempotencyKey, a repeat returns the first reservation (Result.Replayed),
// holding nothing more; a denial is not remembered.
//
// Errors: those of Check (ErrInvalid also for Cost 0 or bad options).
func (e *Engine) Reserve(ctx context.Context, req Request, opt ReserveOptions) (vocab.Reservation, vocab.Result, error) {
	err := req.Validate()
	if req.Cost <= 0 && len(req.More) == 0 {
		err = errors.Join(err, fmt.Errorf("%w: a reservation's amount must be at least 1", ErrInvalid))
	}
	if len(req.More) > 0 {
		total := req.Cost
		for _, m := range req.More {
			total += m.Cost
		}
		if total <= 0 {
			err = errors.Join(err, fmt.Errorf("%w: a reservation's amounts must hold at least 1 unit", ErrInvalid))
		}
	}
	err = errors.Join(err, opt.validate())
	if err != nil {
		return vocab.Reservation{}, vocab.Result{}, err
	}
	return e.reserve(ctx, req, opt)
}

func (e *Engine) reserve(ctx context.Context, req Request, opt ReserveOptions) (vocab.Reservation, vocab.Result, error) {
	select {
	case <-e.closing:
		return vocab.Reservation{}, vocab.Result{}, ErrClosed
	default:
	}
	lost := e.lost.Load()
	if err := e.markReserving(ctx, req.Org); err != nil {
		return vocab.Reservation{}, vocab.Result{}, err
	}
	id := newReservationID(opt.lease)
	c := e.getCall()
	c.ctx, c.rsvID, c.rsvOpt = ctx, id, opt
	e.buildReserve(c, &req, e.Now(), id, opt)
	one := [1]*call{c}
	e.run(ctx, one[:])
	if c.held {
		return vocab.Reservation{}, vocab.Result{}, c.fail // the loop may still write to c: not recycled
	}
	res, err, rid, per, nowMs := c.res, c.fail, c.rid, c.period.ID, c.nowMs
	e.putCall(c)
	if err != nil {
		return vocab.Reservation{}, vocab.Result{}, err
	}
	if !res.Allowed {
		return vocab.Reservation{}, res, nil
	}
	if e.lost.Load() != lost {
		// Redis lost data while this reservation was made (its script met NOSCRIPT,
		// or the org was hydrated): the org may be missing from the reserving set
		// that the sweep reads, so it is added again before the reservation is
		// answered; otherwise nothing would ever expire it.
		if err := e.markReserving(ctx, req.Org); err != nil {
			return vocab.Reservation{}, vocab.Result{}, err
		}
	}
	if res.Replayed {
		r, err := e.Reservation(ctx, req.Org, req.AnchorDay, rid)
		return r, res, err
	}
	if !opt.lease {
		e.reserved()
	}
	r := vocab.Reservation{ID: rid, Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, State: vocab.Held,
		Amount: req.Cost, OnExpiry: opt.OnExpiry, Period: per, CreatedAt: time.UnixMilli(nowMs).UTC(),
		ExpiresAt: time.UnixMilli(nowMs + opt.TTL.Milliseconds()).UTC()}
	if len(req.More) > 0 {
		r.Metrics = make([]vocab.MetricAmount, req.metricCount())
		for m := range r.Metrics {
			metric, cost, _ := req.metricAt(m)
			r.Metrics[m] = vocab.MetricAmount{Metric: metric, Amount: cost}
		}
	}
	return r, res, nil
}

// buildReserve fills c with the EVALSHA of the reserve script: the check's arguments
// (build) with the reservation's keys and its five arguments (scripts/reserve.lua).
func (e *Engine) buildReserve(c *call, req *Request, now time.Time, id string, opt ReserveOptions) {
	e.build(c, req, now)
	c.src = reserveSrc
	k := e.orgKeys(req.Org, c.period)
	a := c.args
	idem := req.IdempotencyKey != ""
	head := 6 // evalsha, sha, numkeys, month, dirty, index
	var idemKey any
	if idem {
		idemKey = a[6]
		head = 7
		a[len(a)-3] = reserveFingerprint(req) // the fingerprint, before the bounds and the packed numbers
	}
	argv := a[head:]
	expires := now.UnixMilli() + opt.TTL.Milliseconds()
	out := make([]any, 0, len(a)+10)
	out = append(out, "evalsha", reserveSHA, 7, k.month, k.dirty, k.tag+"r|"+id, k.tag+"x", k.tag+"h|"+c.period.ID, k.tag+"rd", k.index)
	if idem {
		out[2] = 8
		out = append(out, idemKey)
	}
	out = append(out, argv...)
	out = append(out, id, string(opt.OnExpiry), expires, expires/1000+int64(recordRetention/time.Second), c.period.ID)
	c.args = out
}

// reserveFingerprint is fingerprint with a mark of its own, so an idempotency key first
// used by a check is refused to a reservation and the other way round.
func reserveFingerprint(req *Request) string {
	r := *req
	r.Metric += "\x00reserve"
	return fingerprint(&r)
}

// parseReserve reads reserve.lua's reply once parse has read the answers it shares
// with check.lua: the id (empty when denied), ';', the packed decision; "R" before it
// for a replay.
func (c *call) parseReserve() (vocab.Result, byte, error) {
	s := c.reply
	replay := strings.HasPrefix(s, "R")
	if replay {
		s = s[1:]
	}
	id, packed, ok := strings.Cut(s, ";")
	if !ok {
		return vocab.Result{}, 0, fmt.Errorf("%w: reserve reply %q", ErrBadReply, c.reply)
	}
	var res vocab.Result
	var status byte
	var err error
	if isPacked(packed) { // a reservation's decision is always packed
		res, status, err = decode(packed, &c.req, c.period, c.nowMs)
	} else {
		err = fmt.Errorf("%w %q", ErrBadReply, packed)
	}
	if replay && err != nil { // the request's limits changed since: the levels cannot be named
		res, status, err = vocab.Result{Allowed: true}, statusAllowed, nil
	}
	if err != nil {
		return res, status, err
	}
	if res.Allowed != (id != "") {
		return vocab.Result{}, 0, fmt.Errorf("%w: reserve reply %q: id and decision disagree", ErrBadReply, c.reply)
	}
	res.Replayed = replay
	if replay {
		res.Saturated = false // the replay counted nothing
	}
	c.rid = id
	return res, status, nil
}

// reserved reports an opened reservation to Config.OnReservation.
func (e *Engine) reserved() {
	if f := e.cfg.OnReservation; f != nil {
		f(ReservationEvent{State: vocab.Held})
	}
}

// ReservationEvent is one reservation opened (State Held) or settled, for metrics.
type ReservationEvent struct {
	State        vocab.ReservationState
	OverReserved int64
}
