package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/quotaplane/quotaplane/internal/console"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Authentication: who the caller is (the operator, an org API key, a console session),
// and the two authorization rules the route table (routes.go) applies.

// principal is the authenticated caller. A console session acts as an org key of
// its org with the admin and billing scopes; a viewer's session may only read.
type principal struct {
	operator bool
	key      tenants.APIKey
	console  *console.Session
}

func (p principal) actorName() string {
	if p.operator {
		return "operator"
	}
	if p.console != nil {
		return "console:" + p.console.Email
	}
	return "key:" + p.key.ID
}

type principalKey struct{}

func callerOf(r *http.Request) principal {
	p, _ := r.Context().Value(principalKey{}).(principal)
	return p
}

func actor(r *http.Request) tenants.Actor {
	return tenants.Actor{Name: callerOf(r).actorName(), RequestID: middleware.GetReqID(r.Context())}
}

// authenticate resolves the bearer token to the operator or an org API key; any other
// token, or none, is 401. Authorization (scope, org) is each handler's.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.console != nil && r.Header.Get("Authorization") == "" {
			if p, present, ok := s.consoleSession(w, r); present {
				if ok {
					next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
				}
				return
			}
		}
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		token = strings.TrimSpace(token)
		if !ok || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="quotaplane"`)
			refuse(w, r, derrors.E(derrors.Unauthenticated, "missing credentials: send Authorization: Bearer <token>", nil))
			return
		}
		var p principal
		sum := sha256.Sum256([]byte(token)) // once: the operator check and the key cache both use it
		if s.hasAdmin && subtle.ConstantTimeCompare(sum[:], s.adminToken[:]) == 1 {
			p.operator = true
		} else {
			k, err := s.cache.AuthenticateHashed(r.Context(), token, sum)
			if errors.Is(err, tenants.ErrBadToken) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="quotaplane", error="invalid_token"`)
				refuse(w, r, derrors.E(derrors.Unauthenticated, "invalid, unknown or revoked token", err))
				return
			}
			if err != nil {
				s.fail(w, r, err)
				return
			}
			p.key = k
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	})
}

// consoleSession authenticates a request by its console session cookie. present is
// false when there is no cookie: the caller goes on to the bearer token. Otherwise ok
// tells whether the caller is authenticated; when it is not, the request has been
// answered: 401 for an ended session, 403 for a change without the CSRF token or by a
// viewer.
func (s *Server) consoleSession(w http.ResponseWriter, r *http.Request) (p principal, present, ok bool) {
	sess, present, err := s.console.Authenticate(r)
	switch {
	case !present:
		return principal{}, false, false
	case errors.Is(err, console.ErrNoSession):
		refuse(w, r, derrors.E(derrors.Unauthenticated, "the console session has ended: sign in again", err))
		return principal{}, true, false
	case err != nil:
		s.fail(w, r, err)
		return principal{}, true, false
	case !console.CSRFOK(r):
		refuse(w, r, derrors.E(derrors.Forbidden, "a change made with a console session needs its "+console.CSRFHeader+" header", nil))
		return principal{}, true, false
	case r.Method != http.MethodGet && r.Method != http.MethodHead && !sess.CanChange():
		refuse(w, r, derrors.E(derrors.Forbidden, "a console viewer can read but not change anything", nil))
		return principal{}, true, false
	}
	return principal{console: &sess, key: tenants.APIKey{ID: "console:" + sess.UserID, OrgID: sess.OrgID,
		Scopes: []tenants.Scope{tenants.ScopeAdmin, tenants.ScopeBilling}}}, true, true
}

// requireOperator answers 403 unless the caller is the operator.
func requireOperator(w http.ResponseWriter, r *http.Request) bool {
	if callerOf(r).operator {
		return true
	}
	refuse(w, r, derrors.E(derrors.Forbidden, "this operation needs the operator token", nil))
	return false
}

// requireOrg lets the operator through, and an org key of that org with the scope.
// A key of another org gets 404 whatever the route, so it learns nothing of the org.
func requireOrg(w http.ResponseWriter, r *http.Request, orgID string, scopes ...tenants.Scope) bool {
	p := callerOf(r)
	if p.operator {
		return true
	}
	if p.key.OrgID != orgID {
		refuse(w, r, derrors.E(derrors.NotFound, fmt.Sprintf("org %q not found", orgID), nil))
		return false
	}
	for _, sc := range scopes {
		if p.key.HasScope(sc) {
			return true
		}
	}
	names := make([]string, len(scopes))
	for i, sc := range scopes {
		names[i] = string(sc)
	}
	refuse(w, r, derrors.E(derrors.Forbidden, "this key lacks the scope this operation needs: "+strings.Join(names, " or "), nil))
	return false
}
