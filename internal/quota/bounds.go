package quota

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// Bounds on what one org may make the shared Redis hold (KEYS.md "Bounds"). check.lua
// enforces them in the run that would write, so replicas cannot pass them together: an
// org holds at most IdempotencyRecords idempotency records, and names at most
// UnregisteredUsers distinct unregistered users in a billing period. A check past
// either is refused with a *BoundError and counts nothing.

// The bounds' names, as BoundError.Bound and the metric's label say them.
const (
	BoundIdempotencyRecords = "idempotency_records"
	BoundUnregisteredUsers  = "unregistered_users"
)

// Defaults of Config.IdempotencyRecords and Config.UnregisteredUsers.
const (
	DefaultIdempotencyRecords = 100_000
	DefaultUnregisteredUsers  = 100_000
)

// BoundError is a check or reservation refused because it would take its org past one
// of its bounds on the shared Redis. Nothing was counted or stored. Its kind is
// Unprocessable: the same request is refused until records expire (idempotency) or the
// period ends (users); the request without an idempotency key, or naming a registered
// user, may pass.
type BoundError struct {
	Org   string
	Bound string // BoundIdempotencyRecords or BoundUnregisteredUsers
	Limit int64
}

func (e *BoundError) Error() string {
	switch e.Bound {
	case BoundIdempotencyRecords:
		return fmt.Sprintf("org %s holds its most idempotency records (%d)", e.Org, e.Limit)
	default:
		return fmt.Sprintf("org %s has named its most unregistered users this period (%d)", e.Org, e.Limit)
	}
}

// Kind is Unprocessable.
func (e *BoundError) Kind() derrors.Kind { return derrors.Unprocessable }

// boundError reads check.lua's refusal past a bound ("Qi<limit>", "Qu<limit>"), or nil.
func (c *call) boundError() error {
	s := c.reply
	if len(s) < 3 || s[0] != statusBound {
		return nil
	}
	n, err := strconv.ParseInt(s[2:], 10, 64)
	if err != nil {
		return fmt.Errorf("%w %q", ErrBadReply, s)
	}
	switch s[1] {
	case 'i':
		return &BoundError{Org: c.org, Bound: BoundIdempotencyRecords, Limit: n}
	case 'u':
		return &BoundError{Org: c.org, Bound: BoundUnregisteredUsers, Limit: n}
	}
	return fmt.Errorf("%w %q", ErrBadReply, s)
}

// boundsArgs are check.lua's bounds argument ('<records> <bucket ms> <users>'), the
// users' bound 0 and set: records are counted in buckets of a 24th of the TTL (at
// least a second), so a record leaves the count at most a bucket after it expires.
func boundsArgs(cfg *Config) (none, users string) {
	bucket := max(cfg.IdempotencyTTL/24, time.Second)
	records := max(cfg.IdempotencyRecords, 0) // -1: no bound, 0 to the script
	u := max(cfg.UnregisteredUsers, 0)
	head := strings.Join([]string{strconv.FormatInt(records, 10), strconv.FormatInt(bucket.Milliseconds(), 10)}, " ")
	return head + " 0", head + " " + strconv.FormatInt(u, 10)
}
