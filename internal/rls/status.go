package rls

import (
	"errors"
	"log/slog"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// Errors are answered in one place, as internal/platform/problem answers HTTP's: every
// refusal is an error of a derrors kind, and this table maps the kind to its gRPC code.
// No other code of the project chooses a gRPC status code (TestNoCodeOutsideTheMap
// keeps it so).

// row is one row of the table: the code of a kind; words, when set, replace an error's
// text that carries no detail a caller may see (the causes of a store that failed,
// a panic); log, whether the error is logged.
type row struct {
	code  codes.Code
	words string
	log   bool
}

// table maps every error kind to its code. Unavailable (a store down, no engine)
// answers UNAVAILABLE, which Envoy's failure_mode_deny decides on. A descriptor that
// names no check of the key's org (invalid, not found, unprocessable: a fault of its
// own, checks.InputFault) is no error: it is answered OVER_LIMIT for itself (rls.go);
// only a call without descriptors is INVALID_ARGUMENT. TestEveryKindHasACode checks
// every kind has a row.
var table = [...]row{
	derrors.Internal:             {codes.Internal, "internal error", true},
	derrors.Invalid:              {codes.InvalidArgument, "", false},
	derrors.Unauthenticated:      {codes.Unauthenticated, "", false},
	derrors.Forbidden:            {codes.PermissionDenied, "", false},
	derrors.NotFound:             {codes.InvalidArgument, "", false},
	derrors.MethodNotAllowed:     {codes.Unimplemented, "", false},
	derrors.Exists:               {codes.AlreadyExists, "", false},
	derrors.InUse:                {codes.FailedPrecondition, "", false},
	derrors.TooLarge:             {codes.ResourceExhausted, "", false},
	derrors.UnsupportedMediaType: {codes.InvalidArgument, "", false},
	derrors.Unprocessable:        {codes.InvalidArgument, "", false},
	derrors.RateLimited:          {codes.ResourceExhausted, "", false},
	derrors.Unavailable:          {codes.Unavailable, "the quota store is unavailable; retry shortly", true},
	derrors.Overloaded:           {codes.Unavailable, "too many checks of this org are in flight; retry shortly", false},
	derrors.Canceled:             {codes.Canceled, "the caller went away", false},
	derrors.Conflict:             {codes.FailedPrecondition, "", false},
}

// wordsOf is what a caller is told of err: the detail of a *derrors.Error in err's
// tree, else its row's words, else the error's text.
func wordsOf(err error) string {
	r := rowOf(derrors.KindOf(err))
	var de *derrors.Error
	switch {
	case errors.As(err, &de) && de.Detail != "" && r.code != codes.Canceled:
		return de.Detail
	case r.words != "":
		return r.words
	}
	return err.Error()
}

// rowOf is the row of kind k; Internal's for a kind without one.
func rowOf(k derrors.Kind) row {
	if int(k) >= len(table) || (table[k] == row{}) {
		return table[derrors.Internal]
	}
	return table[k]
}

// CodeOf is the gRPC code of an error's kind.
func CodeOf(err error) codes.Code { return rowOf(derrors.KindOf(err)).code }

// statusOf is the gRPC status of err, its message prefixed by what (when not ""):
// the detail of a *derrors.Error in err's tree, else the row's words, else the
// error's text. Errors of a logged kind are logged; their causes are never sent.
func statusOf(log *slog.Logger, what string, err error) error {
	return statusWith(log, what, err, nil)
}

// statusOfDescriptor is statusOf for an error met deciding descriptor i, d: named by
// descriptorName, its message with d's long values clipped (clipValues).
func statusOfDescriptor(log *slog.Logger, i int, d *ratelimitv3.RateLimitDescriptor, err error) error {
	return statusWith(log, descriptorName(i, d), err, d)
}

// statusWith is statusOf, its message's values of d (when not nil) clipped.
func statusWith(log *slog.Logger, what string, err error, d *ratelimitv3.RateLimitDescriptor) error {
	r := rowOf(derrors.KindOf(err))
	msg := wordsOf(err)
	if d != nil {
		msg = clipValues(msg, d)
	}
	if r.log && log != nil {
		log.Warn("rate limit check not decided", "what", what, "code", r.code.String(), "err", err.Error())
	}
	if what != "" {
		msg = what + ": " + msg
	}
	return status.Error(r.code, msg)
}
