package client

import (
	"context"
	"time"
)

// Hooks are functions the client calls as a call goes (WithHooks): for metrics,
// tracing or logging of one's own. A nil function is not called. They run on the
// call's goroutine, so they must be quick and must not block.
type Hooks struct {
	// OnAttempt is called after each attempt of a call, answered or not.
	OnAttempt func(ctx context.Context, a AttemptInfo)
	// OnRetry is called before the wait that precedes a retry.
	OnRetry func(ctx context.Context, r RetryInfo)
	// OnDecision is called with the decision of each check (each item of a batch)
	// and each reservation: Quotaplane's, or the fail policy's.
	OnDecision func(ctx context.Context, d DecisionInfo)
	// OnLease is called when a lease (WithLeases) is taken, refused, settled or
	// given up, from the client's own goroutines (no caller's context).
	OnLease func(l LeaseInfo)
}

// The events of a LeaseInfo.
const (
	LeaseTaken   = "taken"   // a lease of Units was taken
	LeaseRefused = "refused" // the server answered no lease (Reason): the path is checked one by one
	LeaseSettled = "settled" // the lease was settled with Used (Err: the server no longer knew it)
	LeaseError   = "error"   // taking or settling failed (Err); a lease left unsettled is counted whole
)

// LeaseInfo describes an event of a lease of a path.
type LeaseInfo struct {
	Event                   string // LeaseTaken, LeaseRefused, LeaseSettled or LeaseError
	ID                      string // the lease's id ("" when none was taken)
	Org, Team, User, Metric string
	Units                   int64  // the lease's size
	Used                    int64  // settled or given up: the units it admitted
	Reason                  string // refused: the server's reason (client_leases_off, near_limit, not_leasable)
	Err                     error
}

// AttemptInfo describes one attempt of a call.
type AttemptInfo struct {
	Method, Path string
	N            int           // 1 for the first attempt
	Status       int           // the answer's status; 0 when there was none
	Err          error         // the transport error, when there was no answer
	Duration     time.Duration // of this attempt
}

// RetryInfo describes a retry about to happen.
type RetryInfo struct {
	Method, Path string
	N            int           // the attempt that failed
	Wait         time.Duration // before the next attempt
	RetryAfter   bool          // Wait is the answer's Retry-After
	Err          error         // why attempt N failed (a *Error for a 5xx answer)
}

// DecisionInfo describes the decision of a check or reservation.
type DecisionInfo struct {
	Op         string // "check", "batch" or "reserve"
	Request    CheckRequest
	Allowed    bool
	NotDecided bool  // decided by the fail policy, Cause saying why
	Cause      error // wraps ErrUnavailable
	Mode       string
	Warning    string // warn mode: the level that would have denied
	Leased     bool   // decided in process from a lease (WithLeases)
}

func (c *Client) attempted(ctx context.Context, a AttemptInfo) {
	if c.hooks.OnAttempt != nil {
		c.hooks.OnAttempt(ctx, a)
	}
	if c.log != nil {
		c.log.DebugContext(ctx, "quotaplane client: attempt", "method", a.Method, "path", a.Path, "attempt", a.N,
			"status", a.Status, "err", a.Err, "duration", a.Duration)
	}
}

func (c *Client) retrying(ctx context.Context, r RetryInfo) {
	if c.hooks.OnRetry != nil {
		c.hooks.OnRetry(ctx, r)
	}
	if c.log != nil {
		c.log.InfoContext(ctx, "quotaplane client: retry", "method", r.Method, "path", r.Path, "attempt", r.N,
			"wait", r.Wait, "retry_after", r.RetryAfter, "err", r.Err)
	}
}

func (c *Client) decided(ctx context.Context, d DecisionInfo) {
	if c.hooks.OnDecision != nil {
		c.hooks.OnDecision(ctx, d)
	}
	if c.log != nil && d.NotDecided {
		c.log.WarnContext(ctx, "quotaplane client: not decided; the fail policy answered", "op", d.Op, "org", d.Request.Org,
			"team", d.Request.Team, "user", d.Request.User, "allowed", d.Allowed, "cause", d.Cause)
	}
}
