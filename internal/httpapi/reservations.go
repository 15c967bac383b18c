package httpapi

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Reserver holds and settles reservations on the Redis an org's route names.
// *quota.Engines satisfies it; a Checker that does not cannot serve /v1/reservations.
type Reserver interface {
	Reserve(ctx context.Context, route vocab.Route, req quota.Request, opt quota.ReserveOptions) (quota.Reservation, quota.Result, error)
	Commit(ctx context.Context, route vocab.Route, org string, anchorDay int, id string, used int64) (quota.Reservation, error)
	Release(ctx context.Context, route vocab.Route, org string, anchorDay int, id string) (quota.Reservation, error)
	Reservation(ctx context.Context, route vocab.Route, org string, anchorDay int, id string) (quota.Reservation, error)
	OpenReservations(ctx context.Context, route vocab.Route, org string, anchorDay int, f quota.OpenFilter, after quota.OpenCursor, limit int) ([]quota.Reservation, quota.OpenCursor, error)
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
	case in.Amount < 1 || in.Amount > vocab.MaxUnits:
		return derrors.Field("amount", fmt.Sprintf("must be 1 to %d", vocab.MaxUnits))
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
		setRateLimitHeaders(w.Header(), out, checks.Now(s.checker, route))
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
func (s *Server) reservationRoute(ctx context.Context, p principal) (string, vocab.Route, int, error) {
	if p.operator || p.key.OrgID == "" {
		return "", vocab.Route{}, 0, derrors.E(derrors.Forbidden, "reservations are addressed with an org API key (scope check)", nil)
	}
	if !p.key.HasScope(tenants.ScopeCheck) {
		return "", vocab.Route{}, 0, derrors.E(derrors.Forbidden, "this key lacks the scope this operation needs: check", nil)
	}
	route, anchor, err := s.orgRoute(ctx, p.key.OrgID)
	return p.key.OrgID, route, anchor, err
}

// orgRoute is the Redis route of org and its billing anchor day.
func (s *Server) orgRoute(ctx context.Context, orgID string) (vocab.Route, int, error) {
	org, err := s.cache.Org(ctx, orgID)
	if errors.Is(err, tenants.ErrNotFound) {
		return vocab.Route{}, 0, derrors.E(derrors.NotFound, fmt.Sprintf("org %q not found", orgID), nil)
	}
	if err != nil {
		return vocab.Route{}, 0, derrors.E(derrors.Unavailable, "the tenancy store is unavailable and the org is not cached; retry shortly", err)
	}
	route := org.Route()
	return route, org.Org.BillingAnchorDay, nil
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
	op func(rs Reserver, org string, route vocab.Route, anchor int) (quota.Reservation, error)) {
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
	s.byID(w, r, id, func(rs Reserver, org string, route vocab.Route, anchor int) (quota.Reservation, error) {
		return rs.Reservation(r.Context(), route, org, anchor, id)
	})
}

// ReleaseReservation handles DELETE /v1/reservations/{id}.
func (s *Server) ReleaseReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	s.byID(w, r, id, func(rs Reserver, org string, route vocab.Route, anchor int) (quota.Reservation, error) {
		return rs.Release(r.Context(), route, org, anchor, id)
	})
}

// CommitReservation handles POST /v1/reservations/{id}/commit.
func (s *Server) CommitReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	var in api.CommitRequest
	if !decode(w, r, &in) {
		return
	}
	if in.Used < 0 || in.Used > vocab.MaxUnits {
		refuse(w, r, derrors.Field("used", fmt.Sprintf("must be 0 to %d", vocab.MaxUnits)))
		return
	}
	s.byID(w, r, id, func(rs Reserver, org string, route vocab.Route, anchor int) (quota.Reservation, error) {
		return rs.Commit(r.Context(), route, org, anchor, id, in.Used)
	})
}

// ListOpenReservations handles GET /v1/orgs/{org}/reservations: a page of the org's
// held reservations, soonest to expire first. It reads the org's Redis, as usage's
// reserved does, with the usage routes' authorization.
func (s *Server) ListOpenReservations(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListOpenReservationsParams) {
	if !requireOrg(w, r, org, tenants.ScopeAdmin, tenants.ScopeBilling) {
		return
	}
	after, err := decodeOpenCursor(deref(params.Cursor))
	if err != nil {
		refuse(w, r, err)
		return
	}
	limit := quota.DefaultOpenPage
	if params.Limit != nil {
		limit = *params.Limit
	}
	if limit < 1 || limit > quota.MaxOpenPage { // the spec says so too; the validator runs first
		refuse(w, r, derrors.Field("limit", fmt.Sprintf("must be 1 to %d", quota.MaxOpenPage)))
		return
	}
	rs := s.reserver()
	if rs == nil {
		s.fail(w, r, errNoEngine)
		return
	}
	route, anchor, err := s.orgRoute(r.Context(), org)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f := quota.OpenFilter{Team: deref(params.Team), User: deref(params.User)}
	res, next, err := rs.OpenReservations(r.Context(), route, org, anchor, f, after, limit)
	if err != nil {
		s.fail(w, r, engineError(err))
		return
	}
	out := api.ReservationList{Reservations: mapSlice(res, fromReservation)}
	if !next.IsZero() {
		c := encodeOpenCursor(next)
		out.NextCursor = &c
	}
	writeJSON(w, http.StatusOK, out)
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
