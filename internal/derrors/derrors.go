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
