package console

import (
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

// CookieName is the session cookie. Path=/ so the app's calls to /v1 carry it.
const CookieName = "qp_session"

// CSRFHeader carries the session's CSRF token on every change made with the cookie.
const CSRFHeader = "X-CSRF-Token"

// Handler serves /console/: the app's files and its endpoints under /console/api/:
// GET session (200 with the session and its CSRF token, 204 when not signed in), POST
// sign-in ({"email", "password"}; 401 for any failure) and POST sign-out (204).
type Handler struct {
	sessions *Sessions
	assets   fs.FS // the built app: index.html and assets/
	log      *slog.Logger
}

// NewHandler returns the console's handler. assets holds the built app (web/dist).
func NewHandler(sessions *Sessions, assets fs.FS, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	return &Handler{sessions: sessions, assets: assets, log: log}
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
	case strings.HasPrefix(p, "/console/api/"):
		writeProblem(w, http.StatusNotFound, "no such route: "+r.Method+" "+p)
	default:
		h.static(w, r)
	}
}

// Authenticate returns the session of the request's cookie. present is false when the
// request carries no session cookie at all; err is ErrNoSession for a cookie that names
// no live session.
func (h *Handler) Authenticate(r *http.Request) (sess Session, present bool, err error) {
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		return Session{}, false, nil
	}
	sess, err = h.sessions.Lookup(r.Context(), c.Value)
	return sess, true, err
}

// CSRFOK reports whether a request made with a session cookie carries the session's
// CSRF token. Reads (GET, HEAD, OPTIONS) need none.
func CSRFOK(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	c, err := r.Cookie(CookieName)
	if err != nil {
		return false
	}
	return ValidCSRF(c.Value, r.Header.Get(CSRFHeader))
}

// setCookie writes the session cookie; Secure when the request came over TLS.
func setCookie(w http.ResponseWriter, r *http.Request, value string, expires time.Time) {
	c := &http.Cookie{Name: CookieName, Value: value, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil}
	if value == "" {
		c.MaxAge = -1
	} else {
		c.Expires = expires
	}
	http.SetCookie(w, c)
}

func (h *Handler) session(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeProblem(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	sess, present, err := h.Authenticate(r)
	if err != nil && !errors.Is(err, ErrNoSession) {
		h.fail(w, r, err)
		return
	}
	if !present || err != nil {
		// 204, not 401: asking whether one is signed in is no error (and a browser
		// would log a 401 to its console on every visit to the sign-in page).
		if present {
			setCookie(w, r, "", time.Time{})
		}
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, sess)
}

type signInRequest struct {
	Email    string `json:"email"`
	Password string `json:"password"`
}

func (h *Handler) signIn(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeProblem(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	// A JSON content type cannot be sent cross-site without a CORS preflight, which
	// this server never grants: that keeps other sites from signing a browser in.
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeProblem(w, http.StatusUnsupportedMediaType, "send the sign-in as application/json")
		return
	}
	var in signInRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		writeProblem(w, http.StatusBadRequest, "request body is not valid: "+err.Error())
		return
	}
	if in.Email == "" || in.Password == "" || len(in.Email) > 254 || len(in.Password) > 1024 {
		writeProblem(w, http.StatusBadRequest, "email and password are required")
		return
	}
	id, sess, err := h.sessions.SignIn(r.Context(), in.Email, in.Password)
	if errors.Is(err, ErrBadLogin) {
		writeProblem(w, http.StatusUnauthorized, ErrBadLogin.Error())
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	setCookie(w, r, id, sess.ExpiresAt)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, sess)
}

func (h *Handler) signOut(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeProblem(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	c, err := r.Cookie(CookieName)
	if err != nil || c.Value == "" {
		writeProblem(w, http.StatusUnauthorized, "not signed in")
		return
	}
	if !CSRFOK(r) {
		writeProblem(w, http.StatusForbidden, "missing or wrong "+CSRFHeader+" header")
		return
	}
	if err := h.sessions.SignOut(r.Context(), c.Value); err != nil {
		h.fail(w, r, err)
		return
	}
	setCookie(w, r, "", time.Time{})
	w.WriteHeader(http.StatusNoContent)
}

// static serves the app's files; any other path under /console/ gets index.html, so
// the app's own routes (/console/keys) survive a reload.
func (h *Handler) static(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeProblem(w, http.StatusMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path)
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
			http.NotFound(w, r)
			return
		}
	}
	b, err := fs.ReadFile(h.assets, "index.html")
	if err != nil {
		writeProblem(w, http.StatusNotFound, "the console was not built into this binary: run make web")
		return
	}
	hdr.Set("Content-Type", "text/html; charset=utf-8")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "+
		"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	_, _ = w.Write(b)
}

func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, r.Context().Err()) && r.Context().Err() != nil {
		return
	}
	h.log.Error("console request failed", "err", err, "path", r.URL.Path)
	writeProblem(w, http.StatusInternalServerError, "internal error")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeProblem writes an RFC 9457 problem document, as the /v1 API does.
func writeProblem(w http.ResponseWriter, status int, detail string) {
	title := http.StatusText(status)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type":  "https://quotaplane.dev/problems/" + strings.ReplaceAll(strings.ToLower(title), " ", "-"),
		"title": title, "status": status, "detail": detail,
	})
}
