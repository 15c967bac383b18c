package quota

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/derrors"
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
const reserveHook = "local reserve, idem, argc = false, KEYS[3], #ARGV\n"

// composeReserve makes the reserve script: check.lua with reserve.lua in place of its
// hook line, so a reservation is decided by the check's code, not a copy of it.
func composeReserve(check, head string) string {
	if strings.Count(check, reserveHook) != 1 {
		panic("quota: scripts/check.lua must hold the reserve hook line exactly once: " + reserveHook)
	}
	return strings.Replace(check, reserveHook, head, 1)
}

// ReservationState is where a reservation is in its life.
type ReservationState string

// The states of a reservation. Only a Held one can be settled.
const (
	Held      ReservationState = "held"
	Committed ReservationState = "committed"
	Released  ReservationState = "released"
	Expired   ReservationState = "expired"
)

// OnExpiry is what settles a reservation left open past its expiry.
type OnExpiry string

// The expiry actions.
const (
	// ExpiryCommit counts the whole amount (the default: usage is never lost).
	ExpiryCommit OnExpiry = "commit"
	// ExpiryRelease gives everything back.
	ExpiryRelease OnExpiry = "release"
)

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
	OnExpiry OnExpiry

	lease bool // a lease (lease.go): not reported as a reservation
}

// Reservation is one reservation and, once settled, its settlement.
type Reservation struct {
	ID       string
	Org      string
	Team     string
	User     string
	Metric   string
	State    ReservationState
	Amount   int64
	OnExpiry OnExpiry
	// Period is the billing period the units are held in.
	Period    string
	CreatedAt time.Time
	ExpiresAt time.Time
	// Used, Released (given back) and OverReserved (used beyond Amount, counted in
	// full) are known once settled; SettledAt is when.
	Used         int64
	Released     int64
	OverReserved int64
	SettledAt    time.Time
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
	State ReservationState
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
		o.OnExpiry = ExpiryCommit
	case ExpiryCommit, ExpiryRelease:
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
func (e *Engine) Reserve(ctx context.Context, req Request, opt ReserveOptions) (Reservation, Result, error) {
	err := req.Validate()
	if req.Cost <= 0 {
		err = errors.Join(err, fmt.Errorf("%w: a reservation's amount must be at least 1", ErrInvalid))
	}
	err = errors.Join(err, opt.validate())
	if err != nil {
		return Reservation{}, Result{}, err
	}
	return e.reserve(ctx, req, opt)
}

func (e *Engine) reserve(ctx context.Context, req Request, opt ReserveOptions) (Reservation, Result, error) {
	select {
	case <-e.closing:
		return Reservation{}, Result{}, ErrClosed
	default:
	}
	if err := e.markReserving(ctx, req.Org); err != nil {
		return Reservation{}, Result{}, err
	}
	id := newReservationID(opt.lease)
	c := e.getCall()
	var a attempt
	var nowMs int64
	for {
		now := e.Now()
		nowMs = now.UnixMilli()
		e.buildReserve(c, &req, now, id, opt)
		if c.ask != "" {
			e.sendAsking(ctx, c)
		} else if err := e.submit(ctx, c); err != nil {
			return Reservation{}, Result{}, err // c may still be owned by the loop: not recycled
		}
		res, v, pause, err := e.next(c, &a)
		switch v {
		case resend:
			err = e.sleep(ctx, pause)
		case rehydrate:
			err = e.hydrate(ctx, c.org, c.period)
		}
		if err != nil {
			e.putCall(c)
			return Reservation{}, Result{}, err
		}
		if v != settled {
			continue
		}
		rid, per := c.rid, c.period.ID
		e.putCall(c)
		if !res.Allowed {
			return Reservation{}, res, nil
		}
		if res.Replayed {
			r, err := e.Reservation(ctx, req.Org, req.AnchorDay, rid)
			return r, res, err
		}
		if !opt.lease {
			e.reserved()
		}
		return Reservation{ID: rid, Org: req.Org, Team: req.Team, User: req.User, Metric: req.Metric, State: Held,
			Amount: req.Cost, OnExpiry: opt.OnExpiry, Period: per, CreatedAt: time.UnixMilli(nowMs).UTC(),
			ExpiresAt: time.UnixMilli(nowMs + opt.TTL.Milliseconds()).UTC()}, res, nil
	}
}

// buildReserve fills c with the EVALSHA of the reserve script: the check's arguments
// (build) with the reservation's keys and its five arguments (scripts/reserve.lua).
func (e *Engine) buildReserve(c *call, req *Request, now time.Time, id string, opt ReserveOptions) {
	e.build(c, req, now)
	c.src = reserveSrc
	k := e.orgKeys(req.Org, c.period)
	a := c.args
	idem := req.IdempotencyKey != ""
	head := 5 // evalsha, sha, numkeys, month, dirty
	var idemKey any
	if idem {
		idemKey = a[5]
		head = 6
		a[len(a)-2] = reserveFingerprint(req) // the fingerprint, before the packed numbers
	}
	argv := a[head:]
	expires := now.UnixMilli() + opt.TTL.Milliseconds()
	out := make([]any, 0, len(a)+10)
	out = append(out, "evalsha", reserveSHA, 6, k.month, k.dirty, k.tag+"r|"+id, k.tag+"x", k.tag+"h|"+c.period.ID, k.tag+"rd")
	if idem {
		out[2] = 7
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

// parseReserve decodes reserve.lua's reply: the id (empty when denied), ';', the
// packed decision; "R" before it for a replay; "H" and "C" as check.lua's.
func (c *call) parseReserve() (Result, byte, error) {
	s := c.reply
	switch s {
	case "H":
		return Result{}, statusHydrate, nil
	case "C":
		return Result{}, statusConflict, fmt.Errorf("reserve %s: idempotency key %q: %w", c.org, c.req.IdempotencyKey, ErrIdempotencyConflict)
	}
	replay := strings.HasPrefix(s, "R")
	if replay {
		s = s[1:]
	}
	id, packed, ok := strings.Cut(s, ";")
	if !ok {
		return Result{}, 0, fmt.Errorf("%w: reserve reply %q", ErrBadReply, c.reply)
	}
	res, status, err := parseCompact(packed, &c.req, c.period, c.nowMs)
	if replay && err != nil { // the request's limits changed since: the levels cannot be named
		res, status, err = Result{Allowed: true}, statusAllowed, nil
	}
	if err != nil {
		return res, status, err
	}
	if res.Allowed != (id != "") {
		return Result{}, 0, fmt.Errorf("%w: reserve reply %q: id and decision disagree", ErrBadReply, c.reply)
	}
	res.Replayed = replay
	c.rid = id
	return res, status, nil
}

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
func (e *Engine) Commit(ctx context.Context, org string, anchorDay int, id string, used int64) (Reservation, error) {
	if used < 0 || used > MaxUnits {
		return Reservation{}, fmt.Errorf("%w: used %d is outside 0..%d", ErrInvalid, used, MaxUnits)
	}
	return e.settle(ctx, org, anchorDay, id, ActionCommit, used, false)
}

// Release gives all of reservation id back. A repeated release returns the first
// answer. Errors: those of Commit (*StateError when committed or expired).
func (e *Engine) Release(ctx context.Context, org string, anchorDay int, id string) (Reservation, error) {
	return e.settle(ctx, org, anchorDay, id, ActionRelease, 0, false)
}

// settle settles reservation id; a lease's settlement (lease true) is not reported as
// a reservation's and returns without reading the record back.
func (e *Engine) settle(ctx context.Context, org string, anchorDay int, id string, act Action, used int64, lease bool) (Reservation, error) {
	if !validID(org) {
		return Reservation{}, fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	if lease && !IsLease(id) || !lease && !ValidReservationID(id) {
		return Reservation{}, fmt.Errorf("reservation %q: %w", id, ErrReservationNotFound)
	}
	select {
	case <-e.closing:
		return Reservation{}, ErrClosed
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
		c.args = append(c.args[:0], "evalsha", settleSHA, 4, tag+"x", tag+"rd", tag+"m|"+per.ID, tag+"r|"+id,
			string(act), now.UnixMilli(), used, id)
		if c.ask != "" {
			e.sendAsking(ctx, c)
		} else if err := e.submit(ctx, c); err != nil {
			c = nil // may still be owned by the loop: not recycled
			return Reservation{}, err
		}
		_, v, pause, err := e.next(c, &a)
		if err != nil {
			return Reservation{}, err
		}
		if v == resend {
			if err := e.sleep(ctx, pause); err != nil {
				return Reservation{}, err
			}
			continue
		}
		reply := c.reply
		switch {
		case reply == "H" && !hydrated:
			if err := e.hydrate(ctx, org, per); err != nil {
				return Reservation{}, err
			}
			hydrated = true
			continue
		case reply == "H", reply == "N":
			return Reservation{}, fmt.Errorf("reservation %s: %w", id, ErrReservationNotFound)
		case strings.HasPrefix(reply, "S"):
			return Reservation{}, &StateError{ID: id, State: ReservationState(reply[1:])}
		}
		replay := strings.HasPrefix(reply, "R")
		if replay {
			reply = reply[1:]
		}
		r := Reservation{ID: id, Org: org}
		if err := r.parseAnswer(reply); err != nil {
			return Reservation{}, err
		}
		if !replay && !lease {
			e.settled(&r)
		}
		if r.State == Expired { // it expired before this call came: its expiry settled it
			return Reservation{}, &StateError{ID: id, State: Expired}
		}
		return r, nil
	}
}

// parseAnswer reads settle.lua's answer: state;amount;used;released;over;settled_ms;
// expires_ms;on_expiry;period;first counter field;last counter field.
func (r *Reservation) parseAnswer(s string) error {
	p := strings.Split(s, ";")
	if len(p) != 11 {
		return fmt.Errorf("quota: malformed settlement %q", s)
	}
	var n [6]int64
	for i := range n {
		v, err := strconv.ParseInt(p[i+1], 10, 64)
		if err != nil {
			return fmt.Errorf("quota: malformed settlement %q", s)
		}
		n[i] = v
	}
	r.State = ReservationState(p[0])
	r.Amount, r.Used, r.Released, r.OverReserved = n[0], n[1], n[2], n[3]
	r.SettledAt, r.ExpiresAt = time.UnixMilli(n[4]).UTC(), time.UnixMilli(n[5]).UTC()
	r.OnExpiry, r.Period = OnExpiry(p[7]), p[8]
	first, err1 := parseField(p[9])
	last, err2 := parseField(p[10])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("quota: malformed settlement %q", s)
	}
	r.Metric, r.Team, r.User = first.Metric, last.Team, last.User
	return nil
}

// settled reports a settlement this engine made to Config.OnReservation.
func (e *Engine) settled(r *Reservation) {
	if f := e.cfg.OnReservation; f != nil && !IsLease(r.ID) { // a lease was never reported opened
		f(ReservationEvent{State: r.State, OverReserved: r.OverReserved})
	}
}

// reserved reports an opened reservation to Config.OnReservation.
func (e *Engine) reserved() {
	if f := e.cfg.OnReservation; f != nil {
		f(ReservationEvent{State: Held})
	}
}

// ReservationEvent is one reservation opened (State Held) or settled, for metrics.
type ReservationEvent struct {
	State        ReservationState
	OverReserved int64
}

// Reservation reads reservation id of org (anchorDay: the org's billing anchor day).
// When Redis has lost the org's keys it hydrates first, as a settlement does, so a
// reservation held when the worker last persisted is found.
//
// Errors: ErrReservationNotFound; ErrUnavailable when Redis fails; ErrNotHydrated.
func (e *Engine) Reservation(ctx context.Context, org string, anchorDay int, id string) (Reservation, error) {
	if !validID(org) || !ValidReservationID(id) {
		return Reservation{}, fmt.Errorf("reservation %q: %w", id, ErrReservationNotFound)
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	for hydrated := false; ; hydrated = true {
		h, err := e.rdb.HGetAll(ctx, tag+"r|"+id).Result()
		if err != nil {
			return Reservation{}, checkError(err)
		}
		if len(h) > 0 {
			return recordOf(org, id, h)
		}
		if hydrated {
			return Reservation{}, fmt.Errorf("reservation %s: %w", id, ErrReservationNotFound)
		}
		per := e.periodAt(e.Now(), anchorDay)
		live, err := e.rdb.HExists(ctx, tag+"m|"+per.ID, markerField).Result()
		if err != nil {
			return Reservation{}, checkError(err)
		}
		if live {
			return Reservation{}, fmt.Errorf("reservation %s: %w", id, ErrReservationNotFound)
		}
		if err := e.hydrate(ctx, org, per); err != nil {
			return Reservation{}, err
		}
	}
}

// recordOf decodes a reservation's record hash (scripts/reserve.lua).
func recordOf(org, id string, h map[string]string) (Reservation, error) {
	bad := func() (Reservation, error) {
		return Reservation{}, fmt.Errorf("quota: malformed reservation record %s", id)
	}
	r := Reservation{ID: id, Org: org, State: ReservationState(h["s"]), OnExpiry: OnExpiry(h["x"]), Period: h["p"]}
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
	if ans := h["r"]; ans != "" {
		if err := r.parseAnswer(ans); err != nil {
			return bad()
		}
	}
	return r, nil
}

// reservingKey is the set of orgs that have reserved on this Redis, which the sweep
// reads. Its hash tag "|reservations" is no org's: ids cannot contain '|'. In Cluster
// it is a slot of its own, so a reservation's script cannot add to it: Reserve adds
// the org first (once per engine), and hydration adds it again after Redis lost it.
func (e *Engine) reservingKey() string { return e.cfg.KeyPrefix + ":{|reservations}" }

// markReserving adds org to the reserving set, once per engine.
func (e *Engine) markReserving(ctx context.Context, org string) error {
	if _, ok := e.reserving.Load(org); ok {
		return nil
	}
	if err := e.rdb.SAdd(ctx, e.reservingKey(), org).Err(); err != nil {
		return checkError(err)
	}
	e.reserving.Store(org, true)
	return nil
}

// sweepBatch is the most reservations one script run expires.
const sweepBatch = 500

// ExpireDue settles every reservation of org past its expiry by its on_expiry, and
// returns them. Running it anywhere, any number of times at once, settles each once.
//
// Errors: ErrInvalid for a bad org; ErrUnavailable when Redis fails (those expired by
// the batches done are returned with the error).
func (e *Engine) ExpireDue(ctx context.Context, org string) ([]Reservation, error) {
	if !validID(org) {
		return nil, fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	keys := []string{tag + "x", tag + "rd", tag + "m|"}
	var out []Reservation
	for {
		vals, err := settleScript.Run(ctx, e.rdb, keys, "sweep", e.Now().UnixMilli(), 0, "", tag, sweepBatch).StringSlice()
		if err != nil && !errors.Is(err, redis.Nil) {
			return out, fmt.Errorf("expire reservations of %s: %w", org, checkError(err))
		}
		for _, v := range vals {
			id, ans, _ := strings.Cut(v, ";")
			r := Reservation{ID: id, Org: org}
			if err := r.parseAnswer(ans); err != nil {
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
		if !validID(org) {
			continue
		}
		tag := orgTag(e.cfg.KeyPrefix, org)
		cmds[i] = settleScript.EvalSha(ctx, pipe, []string{tag + "x", tag + "rd", tag + "m|"}, "sweep", now, 0, "", tag, sweepBatch)
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
				r := Reservation{ID: id, Org: orgs[i]}
				if err := r.parseAnswer(ans); err != nil {
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
