package tenants

import (
	"fmt"
	"strings"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The failures the Service returns, wrapped with context. Each is of a derrors kind,
// which the http layer maps to one status in a single table (internal/platform/problem).
// Errors of a Postgres that cannot be reached match derrors.Unavailable.
var (
	// ErrNotFound: the object does not exist, or belongs to another org.
	ErrNotFound = derrors.New(derrors.NotFound, "not found")
	// ErrExists: an object with that id already exists.
	ErrExists = derrors.New(derrors.Exists, "already exists")
	// ErrInvalid: the input breaks a rule of its own; see *ValidationError.
	ErrInvalid = derrors.New(derrors.Invalid, "invalid input")
	// ErrOverAllocated: a valid change would break an allocation rule; see *AllocationError.
	ErrOverAllocated = derrors.New(derrors.Unprocessable, "allocation rule violated")
	// ErrInUse: the object is still referenced (a plan with orgs).
	ErrInUse = derrors.New(derrors.InUse, "in use")
	// ErrPasswordBusy: every password hash slot of this process is taken (see
	// WithPasswordHashes); retry shortly. Nothing was checked or written.
	ErrPasswordBusy = derrors.New(derrors.Overloaded, "too many password checks at once; retry shortly")
	// ErrKeyCap: the org already holds as many active API keys as one org may
	// (WithMaxKeysPerOrg); revoke one first.
	ErrKeyCap = derrors.New(derrors.Unprocessable, "api key cap reached")
)

// FieldError names an invalid field and says what is wrong with it.
type FieldError = derrors.FieldError

// ValidationError collects every problem of one input. It matches ErrInvalid.
type ValidationError struct {
	Fields []FieldError
}

func (e *ValidationError) Error() string {
	parts := make([]string, len(e.Fields))
	for i, f := range e.Fields {
		parts[i] = f.Field + ": " + f.Message
	}
	return "invalid input: " + strings.Join(parts, "; ")
}

// Is makes errors.Is(err, ErrInvalid) and errors.Is(err, derrors.Invalid) true.
func (e *ValidationError) Is(target error) bool {
	return target == ErrInvalid || target == derrors.Invalid
}

// Kind is derrors.Invalid.
func (e *ValidationError) Kind() derrors.Kind { return derrors.Invalid }

// FieldErrors returns the invalid fields.
func (e *ValidationError) FieldErrors() []FieldError { return e.Fields }

// fieldErrs accumulates field problems.
type fieldErrs []FieldError

func (f *fieldErrs) add(field, format string, args ...any) {
	*f = append(*f, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

func (f fieldErrs) err() error {
	if len(f) == 0 {
		return nil
	}
	return &ValidationError{Fields: f}
}

// Violation is one broken allocation rule, with the numbers behind it.
type Violation struct {
	Field     string // the field of the request that caused it, e.g. "limits[0].limit" or "limits[0].burst"
	Metric    string
	Window    vocab.Window
	Parent    string // e.g. `org "acme"`
	ParentMax int64  // the parent's limit (its burst, for a burst rule)
	Allocated int64  // what other children already hold (sum rule), or the largest child (lowering)
	Requested int64
	Message   string
	rule      string // which rule: "above", "sum", "below", "below-sum", "burst-above" or "burst-below" (money messages)
}

// AllocationError lists the allocation rules a change would break. It matches
// ErrOverAllocated.
type AllocationError struct {
	Violations []Violation
}

func (e *AllocationError) Error() string {
	msgs := make([]string, len(e.Violations))
	for i, v := range e.Violations {
		msgs[i] = v.Message
	}
	return strings.Join(msgs, "; ")
}

// Is makes errors.Is(err, ErrOverAllocated) and errors.Is(err, derrors.Unprocessable) true.
func (e *AllocationError) Is(target error) bool {
	return target == ErrOverAllocated || target == derrors.Unprocessable
}

// Kind is derrors.Unprocessable.
func (e *AllocationError) Kind() derrors.Kind { return derrors.Unprocessable }

// FieldErrors names the field behind each violation.
func (e *AllocationError) FieldErrors() []FieldError {
	out := make([]FieldError, len(e.Violations))
	for i, v := range e.Violations {
		out[i] = FieldError{Field: v.Field, Message: v.Message}
	}
	return out
}
