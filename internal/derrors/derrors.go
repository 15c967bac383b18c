// Package derrors is quotaplane's small vocabulary of error kinds, in the style of
// pkgsite's derrors and wtf's error codes. A domain package defines its errors as a
// kind (New) or as a type with a Kind method; stores translate driver errors into
// kinds (see pgdb.DB); the HTTP layer maps each kind to one status and problem type in
// one table (internal/platform/problem). Nothing here knows HTTP.
//
// Adding a domain error is one line:
//
//	ErrIdempotencyConflict = derrors.New(derrors.Unprocessable, "idempotency key reused with a different request")
package derrors

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Kind is what kind of failure an error is, which is all a caller needs to decide
// what to do: fix the request, retry later, or give up.
type Kind uint8

// The kinds. Internal is the zero value: an error of no known kind is a bug or an
// unforeseen failure, and its text is never shown to a caller.
const (
	Internal             Kind = iota // unforeseen; logged, shown as "internal error"
	Invalid                          // the request is malformed or breaks a rule of its own
	Unauthenticated                  // no credentials, or ones that name nobody
	Forbidden                        // the caller may not do this
	NotFound                         // the object does not exist, or belongs to another org
	MethodNotAllowed                 // the route exists, not with this method
	Exists                           // an object with that id already exists
	InUse                            // the object is still referenced
	TooLarge                         // the request body is over the limit
	UnsupportedMediaType             // the body is not in a media type the route reads
	Unprocessable                    // well-formed, but a rule refuses it (over-allocated, ...)
	RateLimited                      // the caller sent too many requests
	Unavailable                      // a dependency (Postgres, Redis) did not answer; retry
	Overloaded                       // too much in flight; retry shortly
	Canceled                         // the caller went away; nobody reads the answer
	Conflict                         // the object's state does not allow this (a settled reservation)
	numKinds
)

var kindNames = [numKinds]string{"internal error", "invalid request", "unauthenticated", "forbidden", "not found",
	"method not allowed", "already exists", "in use", "request too large", "unsupported media type",
	"unprocessable", "rate limited", "unavailable", "overloaded", "canceled", "conflict"}

// Error makes a Kind an error, so errors.Is(err, derrors.NotFound) reads naturally.
func (k Kind) Error() string {
	if k >= numKinds {
		return "unknown error kind"
	}
	return kindNames[k]
}

// Kind returns k: a Kind is its own kind.
func (k Kind) Kind() Kind { return k }

// Kinds lists every kind, for tables that must cover them all.
func Kinds() []Kind {
	out := make([]Kind, numKinds)
	for i := range out {
		out[i] = Kind(i)
	}
	return out
}

// Kinder is an error that knows its kind.
type Kinder interface {
	error
	Kind() Kind
}

// KindOf returns Canceled when err's tree holds a canceled context (the caller went
// away, whatever failed for it), else the kind of the first error in the tree that has
// one; else Unavailable for a deadline that passed waiting on a dependency, and
// Internal for anything else.
func KindOf(err error) Kind {
	var k Kinder
	switch {
	case err == nil:
		return Internal
	case errors.Is(err, context.Canceled):
		return Canceled
	case errors.As(err, &k):
		return k.Kind()
	case errors.Is(err, context.DeadlineExceeded):
		return Unavailable
	}
	return Internal
}

// FieldError names one field of a request and says what is wrong with it.
type FieldError struct {
	Field   string
	Message string
}

// FieldErrorer is an error that names the fields at fault.
type FieldErrorer interface {
	error
	FieldErrors() []FieldError
}

// FieldsOf returns the field errors of the first error in err's tree that has any.
func FieldsOf(err error) []FieldError {
	var f FieldErrorer
	if errors.As(err, &f) {
		return f.FieldErrors()
	}
	return nil
}

// sentinel is an error of a kind with its own text.
type sentinel struct {
	kind Kind
	msg  string
}

func (s *sentinel) Error() string        { return s.msg }
func (s *sentinel) Kind() Kind           { return s.kind }
func (s *sentinel) Is(target error) bool { return target == s.kind }

// New returns a sentinel error of kind k with text msg: errors.Is(err, k) holds for it
// and for every error wrapping it.
func New(k Kind, msg string) error { return &sentinel{kind: k, msg: msg} }

// Error is a failure the caller is told about in so many words: Detail is shown to the
// caller as is (it must hold nothing internal), Fields name the fields at fault, and
// Err, the cause, goes to the logs only.
type Error struct {
	K      Kind
	Detail string
	Fields []FieldError
	Err    error

	context string // set by Wrap: the text is "context: Err", not "Detail: Err"
}

// E returns an *Error of kind k, detail and cause (which may be nil).
func E(k Kind, detail string, cause error, fields ...FieldError) *Error {
	return &Error{K: k, Detail: detail, Fields: fields, Err: cause}
}

// Field returns an Invalid error naming one field: "cost: must be an integer".
func Field(field, msg string) *Error {
	return &Error{K: Invalid, Detail: field + ": " + msg, Fields: []FieldError{{Field: field, Message: msg}}}
}

func (e *Error) Error() string {
	if e.context != "" {
		return e.context + ": " + e.Err.Error()
	}
	if e.Err != nil {
		return e.Detail + ": " + e.Err.Error()
	}
	return e.Detail
}

// Wrap says what failed, in words a caller may be shown, and keeps err's kind:
// errors.Is holds for err, its kind and every error err wraps.
//
// When err is a sentinel (New) of a kind whose words a caller may see (any but
// Internal, Unavailable, Overloaded and Canceled), the result is an *Error whose
// Detail is built here: the context, then the sentinel's words:
//
//	Wrap(tenants.ErrNotFound, "team %q of org %q", "eng", "acme")
//
// answers the caller `team "eng" of org "acme" not found`, however many fmt.Errorf
// contexts are added around it later (they are for the logs). Its text is
// `team "eng" of org "acme": not found`. For any other err, Wrap adds the context to
// the text only ("context: err"), and the caller is shown what err alone would show.
func Wrap(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	context := fmt.Sprintf(format, args...)
	if s, ok := err.(*sentinel); ok && told(s.kind) {
		return &Error{K: s.kind, Detail: context + " " + s.msg, Err: err, context: context}
	}
	return fmt.Errorf("%s: %w", context, err)
}

// told tells whether a caller may see the words of an error of kind k; the others
// are answered in the words of their kind.
func told(k Kind) bool {
	switch k {
	case Internal, Unavailable, Overloaded, Canceled:
		return false
	}
	return true
}

// Kind returns the error's kind.
func (e *Error) Kind() Kind { return e.K }

// FieldErrors returns the fields at fault.
func (e *Error) FieldErrors() []FieldError { return e.Fields }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches the error's kind.
func (e *Error) Is(target error) bool { return target == e.K }

// MaxEcho is the most characters of one value a caller sent that an error's text
// repeats: an id, a metric, a key, a field's name, a path.
const MaxEcho = 64

// Bounded returns text with every value in it cut to MaxEcho characters and marked
// with "...": a quoted value ("..." as %q writes it) longer than that, and any run of
// more than MaxEcho characters without a space (a value written unquoted: a path, a
// field's name). Words of the service are never that long, so what an error says of
// its own is kept; a 1 MB id sent is answered with 64 characters of it, not 1 MB.
// Every HTTP error's text goes through it (internal/platform/problem).
func Bounded(text string) string {
	if len(text) <= MaxEcho {
		return text // fewer bytes than characters allowed: nothing to cut
	}
	var b []byte // allocated at the first cut
	cut := func(i int, keep, end string) {
		if b == nil {
			b = append(make([]byte, 0, min(len(text), 4096)), text[:i]...)
		}
		b = append(append(b, keep...), end...)
	}
	for i := 0; i < len(text); {
		if text[i] == '"' { // a quoted value: to its closing quote, escapes skipped
			j, n, at := i+1, 0, -1
			for j < len(text) && text[j] != '"' {
				if n == MaxEcho {
					at = j
				}
				if text[j] == '\\' && j+1 < len(text) {
					j++
				}
				_, size := utf8.DecodeRuneInString(text[j:])
				j += size
				n++
			}
			if j < len(text) {
				j++ // the closing quote
			}
			if at >= 0 {
				cut(i, text[i:at], `..."`)
			} else if b != nil {
				b = append(b, text[i:j]...)
			}
			i = j
			continue
		}
		j, n, at := i, 0, -1 // a run of characters without a space or a quote
		for j < len(text) && text[j] != ' ' && text[j] != '"' {
			if n == MaxEcho {
				at = j
			}
			_, size := utf8.DecodeRuneInString(text[j:])
			j += size
			n++
		}
		if j == i { // a space
			j++
		}
		if at >= 0 {
			end := "..."
			if c := text[j-1]; c == ':' || c == ',' || c == ';' { // the sentence's, not the value's
				end += string(c)
			}
			cut(i, text[i:at], end)
		} else if b != nil {
			b = append(b, text[i:j]...)
		}
		i = j
	}
	if b == nil {
		return text
	}
	return string(b)
}
