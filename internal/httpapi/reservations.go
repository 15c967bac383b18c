package httpapi

import (
	"bytes"
	"fmt"
	"net/http"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// toReserveInput converts the API's reservation request to the check service's.
func toReserveInput(in api.ReservationRequest) checks.ReserveInput {
	out := checks.ReserveInput{Check: checks.Input{Org: in.Org, Team: in.Team, User: in.User, Metric: in.Metric, IdempotencyKey: in.IdempotencyKey},
		Amount: deref(in.Amount), AmountMissing: in.Amount == nil && in.Amounts == nil, TTL: in.TtlSeconds}
	if in.Amounts != nil {
		out.Amounts = *in.Amounts
		if out.Amounts == nil {
			out.Amounts = map[string]int64{}
		}
	}
	if in.OnExpiry != nil {
		e := string(*in.OnExpiry)
		out.OnExpiry = &e
	}
	return out
}

// fromReservation converts a reservation for the API; levels only when just made.
func fromReservation(res vocab.Reservation) api.Reservation {
	out := api.Reservation{Id: res.ID, State: api.ReservationState(res.State), Org: res.Org, Metric: res.Metric,
		Amount: res.Amount, ExpiresAt: res.ExpiresAt.UTC(), OnExpiry: api.OnExpiry(res.OnExpiry)}
	if res.Team != "" {
		out.Team = &res.Team
	}
	if res.User != "" {
		out.User = &res.User
	}
	if res.State != vocab.Held {
		used, rel, over, at := res.Used, res.Released, res.OverReserved, res.SettledAt.UTC()
		out.Used, out.Released, out.OverReserved, out.SettledAt = &used, &rel, &over, &at
	}
	if res.Metrics != nil {
		ms := make([]api.ReservationMetric, len(res.Metrics))
		for i, m := range res.Metrics {
			ms[i] = api.ReservationMetric{Metric: m.Metric, Amount: m.Amount}
			if res.State != vocab.Held {
				used, rel, over := m.Used, m.Released, m.OverReserved
				ms[i].Used, ms[i].Released, ms[i].OverReserved = &used, &rel, &over
			}
		}
		out.Metrics = &ms
	}
	return out
}

// CreateReservation handles POST /v1/reservations: decided as a check of cost amount.
func (s *Server) CreateReservation(w http.ResponseWriter, r *http.Request) {
	var in api.ReservationRequest
	if !decodeShaped(w, r, &in, reservationShape) {
		return
	}
	rv, err := s.checks.Reserve(r.Context(), callerOfCheck(r), toReserveInput(in))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if d := &rv.Decision; !d.Result.Allowed {
		cr := fromDecision(d)
		setRateLimitHeaders(w.Header(), d, s.headers)
		setRetryAfter(w.Header(), d)
		writeJSON(w, problem.Status(derrors.RateLimited), cr)
		return
	}
	body := fromReservation(rv.Reservation)
	levels := fromDecision(&rv.Decision).Levels
	body.Levels = &levels
	if rv.Decision.Result.Replayed {
		t := true
		body.Replayed = &t
	}
	setRateLimitHeaders(w.Header(), &rv.Decision, s.headers)
	writeJSON(w, http.StatusCreated, body)
}

// reservationAnswer answers an operation on a reservation by id.
func (s *Server) reservationAnswer(w http.ResponseWriter, r *http.Request, res vocab.Reservation, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, fromReservation(res))
}

// GetReservation handles GET /v1/reservations/{id}.
func (s *Server) GetReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	res, err := s.checks.Reservation(r.Context(), callerOfCheck(r), id)
	s.reservationAnswer(w, r, res, err)
}

// ReleaseReservation handles DELETE /v1/reservations/{id}.
func (s *Server) ReleaseReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	res, err := s.checks.Release(r.Context(), callerOfCheck(r), id)
	s.reservationAnswer(w, r, res, err)
}

// CommitReservation handles POST /v1/reservations/{id}/commit.
func (s *Server) CommitReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	var in api.CommitRequest
	if !decodeShaped(w, r, &in, commitShape) {
		return
	}
	// used: a number, or an object of used units per metric. null is neither: it
	// decodes as a number left at 0, and committed nothing used (a client that writes
	// an unknown count as null would bill nothing).
	var res vocab.Reservation
	var err error
	if raw, _ := in.Used.MarshalJSON(); len(bytes.TrimSpace(raw)) == 0 || string(bytes.TrimSpace(raw)) == "null" {
		err = derrors.Field("used", "is required: a number or an object of units per metric, not null")
	} else if n, nerr := in.Used.AsCommitRequestUsed0(); nerr == nil {
		res, err = s.checks.Commit(r.Context(), callerOfCheck(r), id, n)
	} else if m, merr := in.Used.AsCosts(); merr == nil {
		if m == nil {
			m = api.Costs{}
		}
		res, err = s.checks.CommitUsed(r.Context(), callerOfCheck(r), id, m)
	} else {
		err = derrors.Field("used", fmt.Sprintf("must be an integer from 0 to %d, or an object of units per metric", vocab.MaxUnits))
	}
	s.reservationAnswer(w, r, res, err)
}

// ExtendReservation handles POST /v1/reservations/{id}/extend: a heartbeat that moves
// a held reservation's expiry to now + ttl_seconds.
func (s *Server) ExtendReservation(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	var in api.ExtendRequest
	if !decodeShaped(w, r, &in, extendShape) {
		return
	}
	res, err := s.checks.Extend(r.Context(), callerOfCheck(r), id, in.TtlSeconds)
	s.reservationAnswer(w, r, res, err)
}

// ListOpenReservations handles GET /v1/orgs/{org}/reservations: a page of the org's
// held reservations, soonest to expire first. It reads the org's Redis, as usage's
// reserved does, with the usage routes' authorization (declared in routes.go's table).
func (s *Server) ListOpenReservations(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListOpenReservationsParams) {
	res, next, err := s.checks.OpenReservations(r.Context(), org, deref(params.Team), deref(params.User), deref(params.Cursor), deref(params.Limit))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.ReservationList{Reservations: mapSlice(res, fromReservation)}
	if next != "" {
		out.NextCursor = &next
	}
	writeJSON(w, http.StatusOK, out)
}
