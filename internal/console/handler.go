package console

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/forwarded"
	"github.com/quotaplane/quotaplane/internal/platform/jsonnames"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
)

// CookieName is the session cookie over plain HTTP. Path=/ so the app's calls to /v1
// carry it.
const CookieName = "qp_session"

// SecureCookieName is the session cookie when it is Secure (the request reached the
// api over HTTPS, or HandlerOptions.SecureCookies): the __Host- prefix makes the
// browser refuse it unless it is Secure, has Path=/ and no Domain, so no other host
// (a sibling subdomain) can set or shadow it.
const SecureCookieName = "__Host-" + CookieName

// CSRFHeader carries the session's CSRF token on every change made with the cookie.
const CSRFHeader = "X-CSRF-Token"

// Handler serves /console/: the app's files and its endpoints under /console/api/:
// GET session (200 with the session and its CSRF token, 204 when not signed in), POST
// sign-in ({"org", "email", "password"}; 401 for any failure, 429 when throttled, 503
// when every password hash slot is taken), POST sign-out (204) and POST password (the
// signed-in user's own; see changePassword).
type Handler struct {
	sessions *Sessions
	assets   fs.FS // the built app: index.html and assets/
	log      *slog.Logger
	opt      HandlerOptions
}

// HandlerOptions say how the console reads requests that pass through proxies.
type HandlerOptions struct {
	// Proxies (QUOTA_TRUSTED_PROXIES) are believed about the client's address, which
	// the sign-in limits count by, and about whether it used HTTPS.
	Proxies forwarded.Proxies
	// SecureCookies (QUOTA_CONSOLE_SECURE_COOKIES=on) makes the session cookie Secure,
	// named SecureCookieName, whatever the request says; off, it is Secure when the
	// request reached the api over HTTPS (directly or through Proxies).
	SecureCookies bool
}

// NewHandler returns the console's handler. assets holds the built app (web/dist).
func NewHandler(sessions *Sessions, assets fs.FS, log *slog.Logger, opt ...HandlerOptions) *Handler {
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{sessions: sessions, assets: assets, log: log}
	if len(opt) > 0 {
		h.opt = opt[0]
	}
	return h
}

// secure reports whether the session cookie of r is the Secure one.
func (h *Handler) secure(r *http.Request) bool {
	return h.opt.SecureCookies || h.opt.Proxies.HTTPS(r)
}

// cookieName is the name of the session cookie for r: a request over HTTPS reads and
// writes only the __Host- cookie, one over plain HTTP only the other.
func (h *Handler) cookieName(r *http.Request) string {
	if h.secure(r) {
		return SecureCookieName
	}
	return CookieName
}

// sessionID returns the value of r's session cookie, "" when it has none.
func (h *Handler) sessionID(r *http.Request) string {
	c, err := r.Cookie(h.cookieName(r))
	if err != nil {
		return ""
	}
	return c.Value
}

// ServeHTTP serves every path under /console.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/console":
		http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
	case p == "/console/api/session":
		h.session(w, r)
	case p == "/console/api/sign-in":
		h.signIn(w, r)
	case p == "/console/api/sign-out":
		h.signOut(w, r)
	case p == "/console/api/password":
		h.changePassword(w, r)
	case strings.HasPrefix(p, "/console/api/"):
		problem.Write(w, r, h.log, derrors.E(derrors.NotFound, "no such route: "+r.Method+" "+p, nil))
	default:
		h.static(w, r)
	}
}

// Authenticate returns the session of the request's cookie. present is false when the
// request carries no session cookie at all; err is ErrNoSession for a cookie that names
// no live session.
func (h *Handler) Authenticate(r *http.Request) (sess Session, present bool, err error) {
	id := h.sessionID(r)
	if id == "" {
		return Session{}, false, nil
	}
	sess, err = h.sessions.Lookup(r.Context(), id)
	return sess, true, err
}

// CSRFOK reports whether a request made with a session cookie carries the session's
// CSRF token. Reads (GET, HEAD, OPTIONS) need none.
func (h *Handler) CSRFOK(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	id := h.sessionID(r)
	return id != "" && ValidCSRF(id, r.Header.Get(CSRFHeader))
}

// setCookie writes the session cookie: Secure, and named SecureCookieName, when the
// request reached the api over HTTPS or SecureCookies is on.
func (h *Handler) setCookie(w http.ResponseWriter, r *http.Request, value string, expires time.Time) {
	c := &http.Cookie{Name: h.cookieName(r), Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: h.secure(r)}
	if value == "" {
		c.MaxAge = -1
	} else {
		c.Expires = expires
	}
	http.SetCookie(w, c)
}

func (h *Handler) session(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, http.MethodGet, http.MethodHead)
		return
	}
	sess, present, err := h.Authenticate(r)
	if err != nil && !errors.Is(err, ErrNoSession) {
		problem.Write(w, r, h.log, err)
		return
	}
	if !present || err != nil {
		// 204, not 401: asking whether one is signed in is no error (and a browser
		// would log a 401 to its console on every visit to the sign-in page).
		if present {
			h.setCookie(w, r, "", time.Time{})
		}
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, sess)
}

type signInRequest struct {
	Org      string `json:"org"` // the organization the account belongs to
	Email    string `json:"email"`
	Password string `json:"password"`
}

func (h *Handler) signIn(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, http.MethodPost)
		return
	}
	// A JSON content type cannot be sent cross-site without a CORS preflight, which
	// this server never grants: that keeps other sites from signing a browser in.
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		problem.Write(w, r, h.log, derrors.E(derrors.UnsupportedMediaType, "send the sign-in as application/json", nil))
		return
	}
	var in signInRequest
	if !h.decodeSmall(w, r, &in, "org, email and password") {
		return
	}
	var missing []derrors.FieldError
	if in.Org == "" || len(in.Org) > 254 {
		missing = append(missing, derrors.FieldError{Field: "org", Message: "is required: the organization the account belongs to, at most 254 characters"})
	}
	if in.Email == "" || len(in.Email) > 254 {
		missing = append(missing, derrors.FieldError{Field: "email", Message: "is required, at most 254 characters"})
	}
	if in.Password == "" || len(in.Password) > 1024 {
		missing = append(missing, derrors.FieldError{Field: "password", Message: "is required, at most 1024 characters"})
	}
	if len(missing) > 0 {
		problem.Write(w, r, h.log, derrors.E(derrors.Invalid, "org, email and password are required", nil, missing...))
		return
	}
	// No org id or email holds the NUL character, and Postgres cannot take it.
	for _, f := range []struct{ name, value string }{{"org", in.Org}, {"email", in.Email}} {
		if strings.ContainsRune(f.value, 0) {
			problem.Write(w, r, h.log, derrors.E(derrors.Invalid, f.name+": must not contain the NUL character (\\u0000)", nil,
				derrors.FieldError{Field: f.name, Message: "must not contain the NUL character (\\u0000)"}))
			return
		}
	}
	id, sess, err := h.sessions.SignIn(r.Context(), h.opt.Proxies.ClientIP(r), in.Org, in.Email, in.Password)
	if err != nil {
		h.fail(w, r, err) // ErrBadLogin is a 401 that says so; a throttled one a 429
		return
	}
	h.setCookie(w, r, id, sess.ExpiresAt)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, sess)
}

// maxFormBody caps the console's own JSON bodies (a sign-in, a password change).
const maxFormBody = 64 << 10

// decodeSmall decodes the console's own small JSON body into v, whose fields are
// named by fields, and answers why it cannot: 413 past maxFormBody (a 900 KB body was
// cut and then called "not a JSON object"), else 400.
func (h *Handler) decodeSmall(w http.ResponseWriter, r *http.Request, v any, fields string) bool {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxFormBody))
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		problem.Write(w, r, h.log, derrors.E(derrors.TooLarge, fmt.Sprintf("request body is larger than %d bytes", maxFormBody), nil))
		return false
	}
	if err == nil && json.Valid(b) {
		// A name given twice is refused, as on every route (encoding/json keeps the last).
		if name, twice := jsonnames.Duplicate(b); twice {
			problem.Write(w, r, h.log, derrors.Field(name, "field named twice (send each field once)"))
			return false
		}
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
	}
	if err != nil {
		problem.Write(w, r, h.log, derrors.E(derrors.Invalid, "request body must be a JSON object of "+fields, err,
			derrors.FieldError{Field: "body", Message: "must be a JSON object of " + fields}))
		return false
	}
	return true
}

func (h *Handler) signOut(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, http.MethodPost)
		return
	}
	id := h.sessionID(r)
	if id == "" {
		problem.Write(w, r, h.log, derrors.E(derrors.Unauthenticated, "not signed in", nil))
		return
	}
	if !h.CSRFOK(r) {
		problem.Write(w, r, h.log, derrors.E(derrors.Forbidden, "missing or wrong "+CSRFHeader+" header", nil))
		return
	}
	if err := h.sessions.SignOut(r.Context(), id); err != nil {
		problem.Write(w, r, h.log, err)
		return
	}
	h.setCookie(w, r, "", time.Time{})
	w.WriteHeader(http.StatusNoContent)
}

// fail answers err; a throttled sign-in carries its Retry-After.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	var te *ThrottledError
	if errors.As(err, &te) {
		w.Header().Set("Retry-After", strconv.FormatInt(te.Seconds(), 10))
	}
	problem.Write(w, r, h.log, err)
}

type passwordRequest struct {
	CurrentPassword string `json:"current_password"`
	NewPassword     string `json:"new_password"`
}

// changePassword serves POST /console/api/password: the signed-in user sets their own
// password ({"current_password", "new_password"}), with the session's CSRF token like
// every change made with the cookie. Every session of the user ends, and the answer
// is a new session (200, its cookie and CSRF token, as a sign-in's); a wrong current
// password is a 403 and counts as a failed sign-in from this address.
func (h *Handler) changePassword(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, r, http.MethodPost)
		return
	}
	sess, present, err := h.Authenticate(r)
	switch {
	case !present:
		problem.Write(w, r, h.log, derrors.E(derrors.Unauthenticated, "not signed in", nil))
		return
	case err != nil:
		problem.Write(w, r, h.log, err)
		return
	case !h.CSRFOK(r):
		problem.Write(w, r, h.log, derrors.E(derrors.Forbidden, "missing or wrong "+CSRFHeader+" header", nil))
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		problem.Write(w, r, h.log, derrors.E(derrors.UnsupportedMediaType, "send the password change as application/json", nil))
		return
	}
	var in passwordRequest
	if !h.decodeSmall(w, r, &in, "current_password and new_password") {
		return
	}
	var missing []derrors.FieldError
	if in.CurrentPassword == "" || len(in.CurrentPassword) > 1024 {
		missing = append(missing, derrors.FieldError{Field: "current_password", Message: "is required, at most 1024 characters"})
	}
	if in.NewPassword == "" {
		missing = append(missing, derrors.FieldError{Field: "new_password", Message: "is required"})
	}
	if len(missing) > 0 {
		problem.Write(w, r, h.log, derrors.E(derrors.Invalid, "current_password and new_password are required", nil, missing...))
		return
	}
	id, next, err := h.sessions.ChangePassword(r.Context(), h.opt.Proxies.ClientIP(r), sess, in.CurrentPassword, in.NewPassword)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.setCookie(w, r, id, next.ExpiresAt)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, next)
}

// static serves the app's files; any other path under /console/ gets index.html, so
// the app's own routes (/console/keys) survive a reload.
func (h *Handler) static(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, r, http.MethodGet, http.MethodHead)
		return
	}
	name := strings.TrimPrefix(path.Clean(r.URL.Path), "/console")
	name = strings.TrimPrefix(name, "/")
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	if name != "" && name != "index.html" {
		if b, err := fs.ReadFile(h.assets, name); err == nil {
			if strings.HasPrefix(name, "assets/") {
				hdr.Set("Cache-Control", "public, max-age=31536000, immutable") // names carry a content hash
			}
			if ct := mime.TypeByExtension(path.Ext(name)); ct != "" {
				hdr.Set("Content-Type", ct)
			}
			_, _ = w.Write(b)
			return
		}
		if strings.HasPrefix(name, "assets/") || path.Ext(name) != "" {
			problem.Write(w, r, h.log, derrors.E(derrors.NotFound, "no such file: "+r.URL.Path, nil))
			return
		}
	}
	b, err := fs.ReadFile(h.assets, "index.html")
	if err != nil {
		problem.Write(w, r, h.log, derrors.E(derrors.NotFound, "the console was not built into this binary: run make web", nil))
		return
	}
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "+
		"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	_, _ = w.Write(b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = problem.Encoder(w).Encode(v) // <, > and & as they are, as every answer
}

// methodNotAllowed answers 405 with the Allow header of the route.
func methodNotAllowed(w http.ResponseWriter, r *http.Request, allow ...string) {
	w.Header().Set("Allow", strings.Join(allow, ", "))
	problem.Write(w, r, nil, derrors.E(derrors.MethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path, nil))
}
