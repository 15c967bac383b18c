package httpapi

import (
	"fmt"
	"net/http"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// fromLease converts a client lease, or the answer to check one by one, for the API.
func fromLease(l *checks.Lease) api.Lease {
	out := api.Lease{Units: l.Units, TtlMs: l.TTL.Milliseconds()}
	if l.Units == 0 {
		reason := api.LeaseReason(l.Reason)
		out.Reason = &reason
		return out
	}
	at, by := l.ExpiresAt.UTC(), l.SettleBy.UTC()
	levels := fromDecision(&l.Decision).Levels
	out.Id, out.ExpiresAt, out.SettleBy, out.Levels = &l.ID, &at, &by, &levels
	return out
}

// CreateLease handles POST /v1/leases: 201 with a lease, or 200 with units 0.
func (s *Server) CreateLease(w http.ResponseWriter, r *http.Request) {
	var in api.LeaseRequest
	if !decodeShaped(w, r, &in, leaseShape) {
		return
	}
	l, err := s.checks.Lease(r.Context(), callerOfCheck(r), checks.LeaseInput{
		Check: checks.Input{Org: in.Org, Team: in.Team, User: in.User, Metric: in.Metric}, Rate: in.Rate})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusCreated
	if l.Units == 0 {
		status = http.StatusOK
	}
	writeJSON(w, status, fromLease(&l))
}

// SettleLease handles POST /v1/leases/{id}/settle: the lease settled with what the
// client admitted and, with renew, the path's next lease.
func (s *Server) SettleLease(w http.ResponseWriter, r *http.Request, id api.ReservationId) {
	// api.LeaseSettleRequest with used a pointer: a settlement without it is refused,
	// not taken as nothing admitted.
	var in struct {
		Used  *int64   `json:"used"`
		Renew *bool    `json:"renew"`
		Rate  *float64 `json:"rate"`
	}
	if !decodeShaped(w, r, &in, leaseSettleShape) {
		return
	}
	if in.Used == nil {
		s.fail(w, r, derrors.Field("used", fmt.Sprintf("is required: the units admitted from the lease, 0 to %d", vocab.MaxUnits)))
		return
	}
	settled, next, err := s.checks.SettleLease(r.Context(), callerOfCheck(r), id, *in.Used, deref(in.Renew), in.Rate)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := api.LeaseSettlement{}
	out.Settled.Used, out.Settled.Released = settled.Used, settled.Released
	if next != nil {
		n := fromLease(next)
		out.Next = &n
	}
	writeJSON(w, http.StatusOK, out)
}
