package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// The audit log of an org.

// ListAudit handles GET /v1/orgs/{org}/audit, newest first.
func (s *Server) ListAudit(w http.ResponseWriter, r *http.Request, org api.OrgPath, params api.ListAuditParams) {
	es, next, err := s.tenants.ListAudit(r.Context(), org, page(params.Limit, params.Cursor))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, api.AuditList{Items: mapSlice(es, fromAudit), NextCursor: nextPtr(next)})
}

func fromAudit(e tenants.AuditEntry) api.AuditEntry {
	return api.AuditEntry{Id: e.ID, Org: e.OrgID, Actor: e.Actor, Action: e.Action, Object: e.Object,
		Before: rawOrNull(e.Before), After: rawOrNull(e.After), RequestId: e.RequestID, Time: e.Time}
}

func rawOrNull(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}
