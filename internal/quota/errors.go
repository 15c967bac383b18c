package quota

import "github.com/quotaplane/quotaplane/internal/derrors"

// Errors returned by the engine. Redis failures wrap ErrUnavailable as well as the
// client's own error, so callers can apply the plan's failure mode with errors.Is.
var (
	// ErrInvalid marks a request or configuration the engine refuses before asking Redis.
	ErrInvalid = derrors.New(derrors.Invalid, "invalid quota request")
	// ErrUnavailable marks a check that Redis did not answer. A check that failed this
	// way was counted at most once: the engine never re-sends a check script.
	ErrUnavailable = derrors.New(derrors.Unavailable, "quota store unavailable")
	// ErrNotHydrated is returned when an org's counters for the period could not be
	// restored from durable storage, so no decision was made and nothing counted.
	ErrNotHydrated = derrors.New(derrors.Unavailable, "quota counters not hydrated")
	// ErrIdempotencyConflict is returned for a check whose idempotency key was first
	// used, within IdempotencyTTL, by a different request (org, team, user, metric or
	// cost). Nothing was counted; the first decision stays stored under the key.
	ErrIdempotencyConflict = derrors.New(derrors.Unprocessable, "idempotency key reused with a different request")
	// ErrBadReply marks a check (or reservation) whose script answered what the engine
	// cannot read, or failed as it ran (a Lua error): that request's failure, not
	// Redis's, so it never counts against the pool's circuit breaker. The Engines
	// answers a check that failed so by the plan's fail mode, as for ErrUnavailable,
	// and counts it in quotaplane_script_reply_errors_total.
	ErrBadReply = derrors.New(derrors.Unavailable, "quota: malformed script reply")
	// ErrClosed is returned by an engine after Close.
	ErrClosed = derrors.New(derrors.Unavailable, "quota engine closed")
	// ErrRetryingClient is returned by New for a Redis client that retries commands:
	// a retried check script can be counted several times.
	ErrRetryingClient = derrors.New(derrors.Internal, "quota: redis client must not retry (set MaxRetries: -1)")
)
