// Package problem is the one place where an error becomes an HTTP answer: the table
// of error kinds (internal/derrors) to statuses and RFC 9457 problem documents, used
// alike by the admin API, the checks and the console. No other package chooses an
// error status (TestNoStatusOutsideTheMap keeps it so).
package problem

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// TypeBase prefixes the type URI of every problem document; the suffix is the status
// text in kebab case ("unprocessable-entity").
const TypeBase = "https://quotaplane.dev/problems/"

// kind is one row of the table: the status of a kind, and the detail shown when the
// error carries none a caller may see (always, for 5xx).
type kind struct {
	status int
	detail string
}

// table maps every error kind to its answer. Adding a kind is one row here and one
// constant in derrors; TestEveryKindHasAStatus checks the two agree.
var table = [...]kind{
	derrors.Internal:             {http.StatusInternalServerError, "internal error"},
	derrors.Invalid:              {http.StatusBadRequest, "the request is invalid"},
	derrors.Unauthenticated:      {http.StatusUnauthorized, "missing credentials: send Authorization: Bearer <token>"},
	derrors.Forbidden:            {http.StatusForbidden, "not allowed"},
	derrors.NotFound:             {http.StatusNotFound, "not found"},
	derrors.MethodNotAllowed:     {http.StatusMethodNotAllowed, "method not allowed"},
	derrors.Exists:               {http.StatusConflict, "already exists"},
	derrors.InUse:                {http.StatusConflict, "still in use"},
	derrors.TooLarge:             {http.StatusRequestEntityTooLarge, "request body is too large"},
	derrors.UnsupportedMediaType: {http.StatusUnsupportedMediaType, "Content-Type must be application/json"},
	derrors.Unprocessable:        {http.StatusUnprocessableEntity, "the request breaks a rule"},
	derrors.RateLimited:          {http.StatusTooManyRequests, "too many requests"},
	derrors.Unavailable:          {http.StatusServiceUnavailable, "a dependency is unavailable; retry shortly"},
	derrors.Overloaded:           {http.StatusServiceUnavailable, "too many requests in flight; retry shortly"},
	derrors.Canceled:             {499, "the client went away"}, // never written
	derrors.Conflict:             {http.StatusConflict, "the object's state does not allow this"},
}

// Status returns the HTTP status of an error's kind.
func Status(err error) int { return row(derrors.KindOf(err)).status }

func row(k derrors.Kind) kind {
	if int(k) >= len(table) || table[k].status == 0 {
		return table[derrors.Internal]
	}
	return table[k]
}

// FieldError names one invalid field of a request and what is wrong with it.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Document is an RFC 9457 problem document (the spec's Problem).
type Document struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []FieldError `json:"errors,omitempty"`
	// ViolatedPolicies is the member of draft-ietf-httpapi-ratelimit-headers-11's
	// quota-exceeded problem type: on a 429, the names of the RateLimit-Policy items
	// that were exceeded (the admin rate limit's "admin").
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// From returns the problem document of err. Its detail is, in order: the Detail of a
// *derrors.Error in err's tree (derrors.Wrap builds one for a not-found error:
// "team \"x\" of org \"y\" not found"); for a 5xx, the kind's own words (never the
// error's text); the text of the error that names fields; else the error's text. Every
// value the detail and the field errors quote is clipped (vocab.ClipText).
func From(err error) Document {
	k := derrors.KindOf(err)
	r := row(k)
	title := http.StatusText(r.status)
	d := Document{Type: TypeBase + strings.ReplaceAll(strings.ToLower(title), " ", "-"), Title: title, Status: r.status}
	var de *derrors.Error
	var fe derrors.FieldErrorer
	switch {
	case errors.As(err, &de):
		d.Detail = de.Detail
	case r.status >= 500:
		d.Detail = r.detail
	case errors.As(err, &fe):
		d.Detail = fe.Error()
	default:
		d.Detail = err.Error()
	}
	if r.status < 500 {
		for _, f := range derrors.FieldsOf(err) {
			d.Errors = append(d.Errors, FieldError{Field: vocab.ClipText(f.Field), Message: vocab.ClipText(f.Message)})
		}
	}
	// Whatever a message quotes of the request (an id, a metric, a key, a path), the
	// answer repeats at most vocab.MaxEcho characters of each value.
	d.Detail = vocab.ClipText(d.Detail)
	return d
}

// Write answers err as a problem document. An internal error is logged with its
// request id, which the caller is told; an unavailable dependency is logged as a
// warning; overload is left to the metrics (it comes in floods). A canceled request
// gets no answer. An Unavailable or Overloaded answer carries Retry-After: 1 unless
// one is set.
func Write(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	k := derrors.KindOf(err)
	if k == derrors.Canceled {
		return
	}
	d := From(err)
	if log == nil {
		log = slog.Default()
	}
	id := middleware.GetReqID(r.Context())
	switch k {
	case derrors.Internal:
		log.Error("request failed", "err", err.Error(), "method", r.Method, "path", r.URL.Path, "request_id", id)
		if id != "" {
			d.Detail += "; request id " + id
		}
	case derrors.Unavailable:
		log.Warn("dependency unavailable", "err", err.Error(), "method", r.Method, "path", r.URL.Path, "request_id", id)
	}
	if (k == derrors.Unavailable || k == derrors.Overloaded) && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", "1")
	}
	WriteDocument(w, d)
}

// WriteDocument writes d as application/problem+json with d.Status. The text is
// written as it reads ("Bearer <token>", not "Bearer \u003ctoken\u003e"): the
// document is JSON, never HTML, and nosniff keeps a browser from taking it for HTML.
func WriteDocument(w http.ResponseWriter, d Document) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(d.Status)
	_ = Encoder(w).Encode(d)
}

// Encoder is a JSON encoder to w that leaves <, > and & as they are (encoding/json
// escapes them for HTML by default): how every JSON answer is written.
func Encoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}
