package httpapi

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/oapi-codegen/runtime"

	"github.com/quotaplane/quotaplane/internal/console"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Authentication: who the caller is (the operator, an org API key, a console session),
// and the accesses the route table (routes.go) declares and enforces.

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
	if st := stateOf(r.Context()); st != nil && st.hasP {
		return st.p
	}
	p, _ := r.Context().Value(principalKey{}).(principal)
	return p
}

// authenticated hands the request on as p's: in its state (reqstate.go), without a
// copy of the request, or in a context value outside begin.
func authenticated(next http.Handler, w http.ResponseWriter, r *http.Request, p principal) {
	if st := stateOf(r.Context()); st != nil {
		st.p, st.hasP = p, true
		next.ServeHTTP(w, r)
		return
	}
	next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
}

func actor(r *http.Request) tenants.Actor {
	return tenants.Actor{Name: callerOf(r).actorName(), RequestID: middleware.GetReqID(r.Context())}
}

// authenticate resolves the bearer token to the operator or an org API key; any other
// token, or none, is 401. Authorization (scope, org) is the route's access.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.console != nil && r.Header.Get("Authorization") == "" {
			if p, present, ok := s.consoleSession(w, r); present {
				if ok {
					authenticated(next, w, r, p)
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
		sum := tokenSum(token) // once: the operator check and the key cache both use it
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
		authenticated(next, w, r, p)
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
	case !s.console.CSRFOK(r):
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

// access is who may call an operation. Each route declares one in the table of
// routes.go; the zero value declares nothing, and NewHandler refuses a route with it.
type access struct {
	kind   accessKind
	scopes []tenants.Scope // orgAccess, orgOperatorAccess: an org key needs one of them
}

type accessKind uint8

const (
	undeclared        accessKind = iota
	publicAccess                 // no credentials
	checkAccess                  // any credentials: the check service authorizes the key for the org it names
	operatorAccess               // the operator token alone
	orgAccess                    // the operator, or a key of the path's {org} with one of the scopes
	orgOperatorAccess            // as orgAccess first (so another org's key learns nothing), then the operator alone
)

// The accesses a route declares.
var (
	public      = access{kind: publicAccess}
	checkScoped = access{kind: checkAccess}
	operator    = access{kind: operatorAccess}
)

// orgKey is the access of an org's route: the operator, or a key of that org with
// one of the scopes. A key of another org gets 404 whatever the route.
func orgKey(scopes ...tenants.Scope) access { return access{kind: orgAccess, scopes: scopes} }

// orgOperator is the access of an org's route that only the operator may call: a key
// of another org gets 404 and one of the org without the scopes 403, as on the org's
// other routes, before any key is told it needs the operator token.
func orgOperator(scopes ...tenants.Scope) access {
	return access{kind: orgOperatorAccess, scopes: scopes}
}

// valid tells why a route of the pattern cannot have the access.
func (a access) valid(pattern string) error {
	switch a.kind {
	case publicAccess, checkAccess, operatorAccess:
		return nil
	case orgAccess, orgOperatorAccess:
		if len(a.scopes) == 0 {
			return errors.New("an org route's access names no scope")
		}
		if !strings.Contains(pattern, "{org}") {
			return errors.New("an org route's access needs an {org} in the path")
		}
		return nil
	}
	return errors.New("the route declares no access")
}

// middleware enforces the access; nil for public and check routes, whose handlers
// run for any caller the group has let in.
func (a access) middleware() api.MiddlewareFunc {
	if a.kind == publicAccess || a.kind == checkAccess {
		return nil
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if a.allow(w, r) {
				next.ServeHTTP(w, r)
			}
		})
	}
}

// allow answers the refusal and returns false unless the caller has the access.
func (a access) allow(w http.ResponseWriter, r *http.Request) bool {
	if a.kind == operatorAccess {
		return requireOperator(w, r)
	}
	org, err := orgParam(r)
	if err != nil {
		paramError(w, r, err)
		return false
	}
	return requireOrg(w, r, org, a.scopes...) && (a.kind != orgOperatorAccess || requireOperator(w, r))
}

// orgParam is the path's {org}, bound as the generated wrapper binds it (which has
// done so without error before its HandlerMiddlewares run).
func orgParam(r *http.Request) (string, error) {
	var org string
	err := runtime.BindStyledParameterWithOptions("simple", "org", chi.URLParam(r, "org"), &org,
		runtime.BindStyledParameterOptions{ParamLocation: runtime.ParamLocationPath, Required: true, Type: "string",
			ValueIsUnescaped: r.URL.RawPath == ""})
	if err != nil {
		return "", &api.InvalidParamFormatError{ParamName: "org", Err: err}
	}
	return org, nil
}

// tokenSum is the bearer token's SHA-256 (tenants.TokenSum: no allocation).
func tokenSum(token string) [32]byte { return tenants.TokenSum(token) }
