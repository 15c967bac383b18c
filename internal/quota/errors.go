package quota

import "errors"

// Errors returned by the engine. Redis failures wrap ErrUnavailable as well as the
// client's own error, so callers can apply the plan's failure mode with errors.Is.
var (
	// ErrInvalid marks a request or configuration the engine refuses before asking Redis.
	ErrInvalid = errors.New("invalid quota request")
	// ErrUnavailable marks a check that Redis did not answer. A check that failed this
	// way was counted at most once: the engine never re-sends a check script.
	ErrUnavailable = errors.New("quota store unavailable")
	// ErrNotHydrated is returned when an org's counters for the period could not be
	// restored from durable storage, so no decision was made and nothing counted.
	ErrNotHydrated = errors.New("quota counters not hydrated")
	// ErrIdempotencyConflict is returned for a check whose idempotency key was first
	// used, within IdempotencyTTL, by a different request (org, team, user, metric or
	// cost). Nothing was counted; the first decision stays stored under the key.
	ErrIdempotencyConflict = errors.New("idempotency key reused with a different request")
	// ErrClosed is returned by an engine after Close.
	ErrClosed = errors.New("quota engine closed")
	// ErrRetryingClient is returned by New for a Redis client that retries commands:
	// a retried check script can be counted several times.
	ErrRetryingClient = errors.New("quota: redis client must not retry (set MaxRetries: -1)")
)
