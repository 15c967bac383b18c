package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/httpapi/problem"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Reserver holds and settles reservations on the Redis an org's route names.
// *quota.Router satisfies it; a Checker that does not cannot serve /v1/reservations.
type Reserver interface {
	Reserve(ctx context.Context, route quota.Route, req quota.Request, opt quota.ReserveOptions) (quota.Reservation, quota.Result, error)
	Commit(ctx context.Context, route quota.Route, org string, anchorDay int, id string, used int64) (quota.Reservation, error)
	Release(ctx context.Context, route quota.Route, org string, anchorDay int, id string) (quota.Reservation, error)
	Reservation(ctx context.Context, route quota.Route, org string, anchorDay int, id string) (quota.Reservation, error)
}

// MaxReservationTTL is the longest ttl_seconds the API accepts.
const MaxReservationTTL = time.Hour

// reserver is the server's Checker as a Reserver, or nil (then reservations answer
// 503 as checks do without an engine).
func (s *Server) reserver() Reserver {
	r, _ := s.checker.(Reserver)
	return r
}

// validateReservation checks what the spec says of a ReservationRequest (the checks
// group is not validated against the spec) beyond what resolveRequest checks of
// the check it is decided as.
func validateReservation(in api.ReservationRequest) error {
	switch {
	case in.Amount < 1 || in.Amount > quota.MaxValue:
		return derrors.Field("amount", fmt.Sprintf("must be 1 to %d", quota.MaxValue))
	case in.TtlSeconds != nil && (*in.TtlSeconds < 1 || *in.TtlSeconds > int64(MaxReservationTTL/time.Second)):
		return derrors.Field("ttl_seconds", fmt.Sprintf("must be 1 to %d", int64(MaxReservationTTL/time.Second)))
	case in.OnExpiry != nil && !in.OnExpiry.Valid():
		return derrors.Field("on_expiry", "must be commit or release")
	}
	return nil
}

// toReserveOptions converts the request's ttl_seconds and on_expiry.
func toReserveOptions(in api.ReservationRequest) quota.ReserveOptions {
	opt := quota.ReserveOptions{TTL: time.Minute, OnExpiry: quota.ExpiryCommit}
	if in.TtlSeconds != nil {
		opt.TTL = time.Duration(*in.TtlSeconds) * time.Second
	}
	if in.OnExpiry != nil {
		opt.OnExpiry = quota.OnExpiry(*in.OnExpiry)
	}
	return opt
}

// fromReservation converts a reservation for the API; levels only when just made.
func fromReservation(res quota.Reservation) api.Reservation {
	out := api.Reservation{Id: res.ID, State: api.ReservationState(res.State), Org: res.Org, Metric: res.Metric,
		Amount: res.Amount, ExpiresAt: res.ExpiresAt.UTC(), OnExpiry: api.OnExpiry(res.OnExpiry)}
	if res.Team != "" {
		out.Team = &res.Team
	}
	if res.User != "" {
		out.User = &res.User
	}
	if res.State != quota.Held {
		used, rel, over, at := res.Used, res.Released, res.OverReserved, res.SettledAt.UTC()
		out.Used, out.Released, out.OverReserved, out.SettledAt = &used, &rel, &over, &at
	}
	return out
}

// CreateReservation handles POST /v1/reservations: decided as a check of cost amount.
func (s *Server) CreateReservation(w http.ResponseWriter, r *http.Request) {
	var in api.ReservationRequest
	if !decode(w, r, &in) {
		return
	}
	if err := validateReservation(in); err != nil {
		refuse(w, r, err)
		return
	}
	rs := s.reserver()
	amount := in.Amount
	check := api.CheckRequest{Org: in.Org, Team: in.Team, User: in.User, Metric: in.Metric, Cost: &amount, IdempotencyKey: in.IdempotencyKey}
	req, route, ans, err := s.resolveCheck(r.Context(), callerOf(r), check)
	if err == nil && rs == nil {
		err = errNoEngine
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res, out, err := rs.Reserve(r.Context(), route, req, toReserveOptions(in))
	if err != nil {
		s.fail(w, r, engineError(err))
		return
	}
	if !out.Allowed {
		cr := fromResult(out, quota.Outcome{}, ans)
		setRateLimitHeaders(w.Header(), out, time.Now())
		w.Header().Set("Retry-After", strconv.FormatInt(*cr.RetryAfterSeconds, 10))
		writeJSON(w, problem.Status(derrors.RateLimited), cr)
		return
	}
	body := fromReservation(res)
	levels := fromResult(out, quota.Outcome{}, ans).Levels
	body.Levels = &levels
	if out.Replayed {
		t := true
		body.Replayed = &t
	}
	writeJSON(w, http.StatusCreated, body)
}

// reservationRoute authorizes a request on a reservation by id: an org key with the
// check scope; the org is the key's, so another org's reservation is simply absent.
func (s *Server) reservationRoute(ctx context.Context, p principal) (string, quota.Route, int, error) {
	if p.operator || p.key.OrgID == "" {
		return "", quota.Route{}, 0, derrors.E(derrors.Forbidden, "reservations are addressed with an org API key (scope check)", nil)
	}
	if !p.key.HasScope(tenants.ScopeCheck) {
		return "", quota.Route{}, 0, derrors.E(derrors.Forbidden, "this key lacks the scope this operation needs: check", nil)
	}
	org, err := s.cache.Org(ctx, p.key.OrgID)
	if errors.Is(err, tenants.ErrNotFound) {
		return "", quota.Route{}, 0, derrors.E(derrors.NotFound, fmt.Sprintf("org %q not found", p.key.OrgID), nil)
	}
	if err != nil {
		return "", quota.Route{}, 0, derrors.E(derrors.Unavailable, "the tenancy store is unavailable and the org is not cached; retry shortly", err)
	}
	route := quota.Route{Pool: org.Pool, RedisURL: org.Org.RedisURL, FailMode: quota.FailMode(org.FailMode), Plan: org.Org.PlanID}
	return p.key.OrgID, route, org.Org.BillingAnchorDay, nil
}

// reservationError says what a failed operation on reservation id means to the caller.
func reservationError(id string, err error) error {
	var se *quota.StateError
	switch {
	case errors.Is(err, quota.ErrReservationNotFound):
		return derrors.E(derrors.NotFound, fmt.Sprintf("reservation %q not found", id), nil)
	case errors.As(err, &se):
		return derrors.E(derrors.Conflict, fmt.Sprintf("reservation %q is already %s", id, se.State), err)
	}
	return engineError(err)
}

// byID runs op on the reservation named in the path, for the key's org.
func (s *Server) byID(w http.ResponseWriter, r *http.Request, id string,
	op func(rs Reserver, org string, route quota.Route, anchor int) (quota.Reservation, error)) {
	rs := s.reserver()
	if rs == nil {
		s.fail(w, r, errNoEngine)
		return
	}
	org, route, anchor, err := s.reservationRoute(r.Context(), callerOf(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := op(rs, org, route, anchor)
	if err != nil {
		s.fail(w, r, reservationError(id, err))
		return
	}
	writeJSON(w, http.StatusOK, fromReservation(res))
}

// GetReservation handles GET /v1/reservations/{id}.
func (s *Server) GetReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	s.byID(w, r, id, func(rs Reserver, org string, route quota.Route, anchor int) (quota.Reservation, error) {
		return rs.Reservation(r.Context(), route, org, anchor, id)
	})
}

// ReleaseReservation handles DELETE /v1/reservations/{id}.
func (s *Server) ReleaseReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	s.byID(w, r, id, func(rs Reserver, org string, route quota.Route, anchor int) (quota.Reservation, error) {
		return rs.Release(r.Context(), route, org, anchor, id)
	})
}

// CommitReservation handles POST /v1/reservations/{id}/commit.
func (s *Server) CommitReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	var in api.CommitRequest
	if !decode(w, r, &in) {
		return
	}
	if in.Used < 0 || in.Used > quota.MaxValue {
		refuse(w, r, derrors.Field("used", fmt.Sprintf("must be 0 to %d", quota.MaxValue)))
		return
	}
	s.byID(w, r, id, func(rs Reserver, org string, route quota.Route, anchor int) (quota.Reservation, error) {
		return rs.Commit(r.Context(), route, org, anchor, id, in.Used)
	})
}
