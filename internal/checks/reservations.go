package checks

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// MaxReservationTTL is the longest TTL a reservation may be asked for.
const MaxReservationTTL = time.Hour

// ReserveInput names one reservation: a check of cost Amount (Check.Cost is ignored),
// held for TTL (default a minute) and settled by OnExpiry (default commit) if left
// open. Nil pointers are absent fields.
type ReserveInput struct {
	Check  Input
	Amount int64
	// AmountMissing says the request gave no amount (nor amounts): "is required",
	// where an amount of 0 given is "must be 1 to ...".
	AmountMissing bool
	// Amounts holds several metrics instead of Check.Metric and Amount (which is then 0).
	Amounts  map[string]int64
	TTL      *int64 // seconds
	OnExpiry *string
}

// Validate checks the reservation's own fields (amount, ttl_seconds, on_expiry);
// the check's are checked as Check checks them.
func (in ReserveInput) Validate() error {
	if in.Check.Org == "" { // the first required field first, as a check says it
		return derrors.Field("org", msgRequired)
	}
	if in.Amounts != nil {
		if err := validCosts("amounts", in.Amounts, in.Check.Metric != nil, in.Amount != 0, "metric", "amount"); err != nil {
			return err
		}
		var total int64
		for _, a := range in.Amounts {
			total += a
		}
		if total < 1 {
			return derrors.Field("amounts", "must hold at least 1 unit")
		}
	}
	switch {
	case in.Amounts == nil && in.AmountMissing:
		return derrors.Field("amount", fmt.Sprintf("%s (1 to %d), or amounts of several metrics", msgRequired, vocab.MaxUnits))
	case in.Amounts == nil && (in.Amount < 1 || in.Amount > vocab.MaxUnits):
		return derrors.Field("amount", fmt.Sprintf("must be 1 to %d", vocab.MaxUnits))
	case in.TTL != nil && (*in.TTL < 1 || *in.TTL > int64(MaxReservationTTL/time.Second)):
		return derrors.Field("ttl_seconds", fmt.Sprintf("must be 1 to %d", int64(MaxReservationTTL/time.Second)))
	case in.OnExpiry != nil && *in.OnExpiry != string(vocab.ExpiryCommit) && *in.OnExpiry != string(vocab.ExpiryRelease):
		return derrors.Field("on_expiry", "must be commit or release")
	}
	return nil
}

// options are the engine's options of the reservation.
func (in ReserveInput) options() quota.ReserveOptions {
	opt := quota.ReserveOptions{TTL: time.Minute, OnExpiry: vocab.ExpiryCommit}
	if in.TTL != nil {
		opt.TTL = time.Duration(*in.TTL) * time.Second
	}
	if in.OnExpiry != nil {
		opt.OnExpiry = vocab.OnExpiry(*in.OnExpiry)
	}
	return opt
}

// Reserved is a reservation just asked for: when Decision.Result.Allowed, the
// reservation held; else the denial, described as a check's.
type Reserved struct {
	Reservation vocab.Reservation
	Decision    Decision
}

// Reserve authorizes, resolves and decides a reservation as a check of cost Amount,
// holding the units when allowed. Errors: Check's, and Invalid naming amount,
// ttl_seconds or on_expiry.
func (s *Service) Reserve(ctx context.Context, c Caller, in ReserveInput) (r Reserved, err error) {
	enter(ctx, "checks.Reserve")
	if err := in.Validate(); err != nil {
		return Reserved{}, err
	}
	check := in.Check
	check.Cost = &in.Amount
	if in.Amounts != nil {
		check.Cost, check.Costs = nil, in.Amounts
	}
	rc, err := s.resolveHeld(ctx, c, check)
	if err != nil {
		return Reserved{}, err
	}
	r.Decision = rc.decision(in.Amounts != nil)
	route := rc.route
	if r.Reservation, r.Decision.Result, err = s.engine.Reserve(ctx, route, rc.req, in.options()); err != nil {
		return Reserved{}, engineError(err)
	}
	describe(&r.Decision, s.engine.Now(route))
	return r, nil
}

// resolveHeld resolves check as what the engine will hold units of (a reservation or a
// client lease): priced, and refused when the service has no engine.
func (s *Service) resolveHeld(ctx context.Context, c Caller, check Input) (resolved, error) {
	rc, err := s.resolve(ctx, c, check, nil)
	if err == nil {
		err = price(&rc.req, rc.price)
	}
	if err == nil && s.engine == nil {
		err = ErrNoEngine
	}
	return rc, err
}

// errNotOrgKey refuses an operation on a reservation by id asked by other than an
// org API key.
var errNotOrgKey = derrors.E(derrors.Forbidden, "reservations and leases are addressed with an org API key (scope check)", nil)

// byID runs op on reservation id of the caller's org: an org key with the check
// scope; the org is the key's, so another org's reservation is simply absent.
func (s *Service) byID(ctx context.Context, c Caller, id string,
	op func(route vocab.Route, org string, anchor int) (vocab.Reservation, error)) (vocab.Reservation, error) {
	if s.engine == nil {
		return vocab.Reservation{}, ErrNoEngine
	}
	if c.Operator || c.Key.OrgID == "" {
		return vocab.Reservation{}, errNotOrgKey
	}
	if err := c.Authorize(c.Key.OrgID); err != nil {
		return vocab.Reservation{}, err
	}
	org, err := s.org(ctx, c.Key.OrgID)
	if err != nil {
		return vocab.Reservation{}, err
	}
	res, err := op(org.Route(), c.Key.OrgID, org.Org.BillingAnchorDay)
	if err != nil {
		return vocab.Reservation{}, reservationError(id, err)
	}
	return res, nil
}

// Reservation reads reservation id of the caller's org. Errors: NotFound,
// Forbidden (not an org key with the check scope), Unavailable.
func (s *Service) Reservation(ctx context.Context, c Caller, id string) (vocab.Reservation, error) {
	return s.byID(ctx, c, id, func(route vocab.Route, org string, anchor int) (vocab.Reservation, error) {
		return s.engine.Reservation(ctx, route, org, anchor, id)
	})
}

// Release gives back the units of reservation id. Errors: Reservation's, and
// Conflict when it is settled already.
func (s *Service) Release(ctx context.Context, c Caller, id string) (vocab.Reservation, error) {
	return s.byID(ctx, c, id, func(route vocab.Route, org string, anchor int) (vocab.Reservation, error) {
		return s.engine.Release(ctx, route, org, anchor, id)
	})
}

// Commit counts used units of reservation id and gives back the rest. A priced
// reservation (one that holds spend) settles its spend to the price of used at the
// org's rates (money.go). Errors: Release's, and Invalid naming used.
func (s *Service) Commit(ctx context.Context, c Caller, id string, used int64) (vocab.Reservation, error) {
	if used < 0 || used > vocab.MaxUnits {
		return vocab.Reservation{}, derrors.Field("used", fmt.Sprintf("must be 0 to %d", vocab.MaxUnits))
	}
	return s.byID(ctx, c, id, func(route vocab.Route, org string, anchor int) (vocab.Reservation, error) {
		if u, ok, err := s.pricedUsed(ctx, route, org, anchor, id, nil, used); err != nil || ok {
			if err != nil {
				return vocab.Reservation{}, err
			}
			return s.engine.CommitUsed(ctx, route, org, anchor, id, u)
		}
		return s.engine.Commit(ctx, route, org, anchor, id, used)
	})
}

// CommitUsed is Commit with used units per metric (a metric left out used 0), the
// only form a multi-metric reservation takes; a priced one's spend is settled to the
// price of used, as Commit's, and one that holds spend itself commits used's spend
// as given. Errors: Commit's, Invalid naming used for a metric the reservation does
// not hold, or for spend of a priced reservation (it is priced, not given).
func (s *Service) CommitUsed(ctx context.Context, c Caller, id string, used map[string]int64) (vocab.Reservation, error) {
	if err := validCosts("used", used, false, false, "", ""); err != nil {
		return vocab.Reservation{}, err
	}
	r, err := s.byID(ctx, c, id, func(route vocab.Route, org string, anchor int) (vocab.Reservation, error) {
		u, ok, err := s.pricedUsed(ctx, route, org, anchor, id, used, 0)
		if err != nil {
			return vocab.Reservation{}, err
		}
		if !ok {
			u = used
		}
		return s.engine.CommitUsed(ctx, route, org, anchor, id, u)
	})
	if errors.Is(err, quota.ErrInvalid) {
		return vocab.Reservation{}, derrors.E(derrors.Invalid, "used: "+err.Error(), err, derrors.FieldError{Field: "used", Message: err.Error()})
	}
	return r, err
}

// pricedUsed is the used units of a priced reservation with its spend priced at the
// org's rates: used (several metrics), or one (its one other metric). A reservation
// is priced when it holds spend beside a metric the org's rates price: its spend was
// derived from them, and so is the spend it used (naming spend in used is refused).
// One that holds spend and no priced metric was given its spend (a reservation may
// not name spend beside a priced metric, price refuses it), and spend is then a
// metric like any: ok is false and the commit goes on as given, counting the spend
// used exactly. ok is false too when the org has no rates or the reservation holds no
// spend. Only an org with rates pays the read of the reservation.
func (s *Service) pricedUsed(ctx context.Context, route vocab.Route, orgID string, anchor int, id string,
	used map[string]int64, one int64) (map[string]int64, bool, error) {
	org, err := s.org(ctx, orgID)
	if err != nil || len(org.Rates) == 0 {
		return nil, false, err
	}
	res, err := s.engine.Reservation(ctx, route, orgID, anchor, id)
	if err != nil {
		return nil, false, err
	}
	var metrics []string
	held, priced := false, false
	for _, m := range res.Metrics {
		if m.Metric == tenants.SpendMetric {
			held = true
		} else {
			metrics = append(metrics, m.Metric)
			_, p := org.Rates[m.Metric]
			priced = priced || p
		}
	}
	if !held || !priced {
		return nil, false, nil
	}
	if _, named := used[tenants.SpendMetric]; named {
		return nil, false, derrors.Field("used", "spend is priced from the org's rates: give the used units of the metrics it prices")
	}
	if used == nil && len(metrics) != 1 {
		return nil, false, nil
	}
	out := make(map[string]int64, len(metrics)+1)
	if used == nil {
		out[metrics[0]] = one
	}
	for m, u := range used {
		out[m] = u
	}
	req := quota.Request{}
	for i, m := range metrics {
		if i == 0 {
			req.Metric, req.Cost = m, out[m]
		} else {
			req.More = append(req.More, quota.MetricCost{Metric: m, Cost: out[m]})
		}
	}
	spend, _, err := spendOf(&req, org.Rates)
	if err != nil {
		return nil, false, derrors.Field("used", err.Error())
	}
	out[tenants.SpendMetric] = spend
	return out, true, nil
}

// Extend moves the expiry of held reservation id to now + ttlSeconds (1 to
// MaxReservationTTL in seconds, as a reservation's ttl_seconds): the heartbeat of a
// holder whose work outlives its TTL. Errors: Reservation's, Invalid naming
// ttl_seconds, and Conflict naming the state once it is settled.
func (s *Service) Extend(ctx context.Context, c Caller, id string, ttlSeconds int64) (vocab.Reservation, error) {
	if ttlSeconds < 1 || ttlSeconds > int64(MaxReservationTTL/time.Second) {
		return vocab.Reservation{}, derrors.Field("ttl_seconds", fmt.Sprintf("must be 1 to %d", int64(MaxReservationTTL/time.Second)))
	}
	return s.byID(ctx, c, id, func(route vocab.Route, org string, anchor int) (vocab.Reservation, error) {
		return s.engine.Extend(ctx, route, org, anchor, id, time.Duration(ttlSeconds)*time.Second)
	})
}

// InFlight is the units of org held at once per counter by open reservations that
// charged a concurrent limit (usage's in_flight). The caller is authorized for org by
// the transport. Errors: NotFound, Unavailable.
func (s *Service) InFlight(ctx context.Context, orgID string) (map[quota.Counter]int64, error) {
	if s.engine == nil {
		return nil, ErrNoEngine
	}
	org, err := s.org(ctx, orgID)
	if err != nil {
		return nil, err
	}
	m, err := s.engine.InFlight(ctx, org.Route(), orgID)
	if err != nil {
		return nil, engineError(err)
	}
	return m, nil
}

// OpenReservations is a page of org's held reservations of team and user ("" for
// any), soonest to expire first, after cursor ("" for the first page), at most limit
// (1 to quota.MaxOpenPage; 0 for quota.DefaultOpenPage), and the cursor of the next
// page ("" on the last). The caller is authorized for org by the transport (the usage
// routes' scopes). Errors: Invalid naming limit or cursor, NotFound, Unavailable.
func (s *Service) OpenReservations(ctx context.Context, orgID, team, user, cursor string, limit int) ([]vocab.Reservation, string, error) {
	if limit == 0 {
		limit = quota.DefaultOpenPage
	}
	if limit < 1 || limit > quota.MaxOpenPage {
		return nil, "", derrors.Field("limit", fmt.Sprintf("must be 1 to %d", quota.MaxOpenPage))
	}
	after, err := decodeOpenCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if s.engine == nil {
		return nil, "", ErrNoEngine
	}
	org, err := s.org(ctx, orgID)
	if err != nil {
		return nil, "", err
	}
	f := quota.OpenFilter{Team: team, User: user}
	res, next, err := s.engine.OpenReservations(ctx, org.Route(), orgID, org.Org.BillingAnchorDay, f, after, limit)
	if err != nil {
		return nil, "", engineError(err)
	}
	if next.IsZero() {
		return res, "", nil
	}
	return res, encodeOpenCursor(next), nil
}

// encodeOpenCursor makes the opaque cursor of a page of open reservations:
// "<expires_at ms>.<id>", base64url-encoded as the other lists' cursors are.
func encodeOpenCursor(c quota.OpenCursor) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.ExpiresAt, 10) + "." + c.ID))
}

// decodeOpenCursor reads a cursor encodeOpenCursor made ("" is the first page); any
// other is refused naming the cursor, as the other lists refuse theirs.
func decodeOpenCursor(s string) (quota.OpenCursor, error) {
	if s == "" {
		return quota.OpenCursor{}, nil
	}
	bad := derrors.Field("cursor", "is not a cursor this API returned")
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return quota.OpenCursor{}, bad
	}
	ms, id, ok := strings.Cut(string(b), ".")
	at, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil || at < 0 || ms != strconv.FormatInt(at, 10) || !quota.ValidReservationID(id) && !quota.IsLease(id) {
		return quota.OpenCursor{}, bad
	}
	return quota.OpenCursor{ExpiresAt: at, ID: id}, nil
}

// org is orgID resolved from the cache. Errors: NotFound, Unavailable.
func (s *Service) org(ctx context.Context, orgID string) (tenants.ResolvedOrg, error) {
	org, err := s.cache.Org(ctx, orgID)
	if errors.Is(err, tenants.ErrNotFound) {
		return tenants.ResolvedOrg{}, derrors.E(derrors.NotFound, fmt.Sprintf("org %q not found", orgID), nil)
	}
	if err != nil {
		return tenants.ResolvedOrg{}, derrors.E(derrors.Unavailable, "the tenancy store is unavailable and the org is not cached; retry shortly", err)
	}
	return org, nil
}

// reservationError says what a failed operation on reservation id means to the caller.
// The id is the caller's and may be anything up to the path's length: it is echoed
// whole only while it is of an id's size.
func reservationError(id string, err error) error {
	if len(id) > 64 {
		id = id[:64] + "..."
	}
	var se *quota.StateError
	switch {
	case errors.Is(err, quota.ErrReservationNotFound):
		return derrors.E(derrors.NotFound, fmt.Sprintf("reservation %q not found", id), nil)
	case errors.As(err, &se):
		return derrors.E(derrors.Conflict, fmt.Sprintf("reservation %q is already %s", id, se.State), err)
	}
	return engineError(err)
}
