package tenants

import (
	"errors"
	"fmt"
	"strings"
)

// The kinds of failure the Service returns, wrapped with context. The http layer maps
// each to one status in a single table.
var (
	// ErrNotFound: the object does not exist, or belongs to another org.
	ErrNotFound = errors.New("not found")
	// ErrExists: an object with that id already exists.
	ErrExists = errors.New("already exists")
	// ErrInvalid: the input breaks a rule of its own; see *ValidationError.
	ErrInvalid = errors.New("invalid input")
	// ErrOverAllocated: a valid change would break an allocation rule; see *AllocationError.
	ErrOverAllocated = errors.New("allocation rule violated")
	// ErrInUse: the object is still referenced (a plan with orgs).
	ErrInUse = errors.New("in use")
)

// FieldError names an invalid field and says what is wrong with it.
type FieldError struct {
	Field   string
	Message string
}

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

// Is makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

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
	Field     string // the field of the request that caused it, e.g. "limits[0].limit"
	Metric    string
	Window    Window
	Parent    string // e.g. `org "acme"`
	ParentMax int64  // the parent's limit
	Allocated int64  // what other children already hold (sum rule), or the largest child (lowering)
	Requested int64
	Message   string
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

// Is makes errors.Is(err, ErrOverAllocated) true.
func (e *AllocationError) Is(target error) bool { return target == ErrOverAllocated }
