package quota

import (
	"errors"
	"fmt"
	"time"
)

// MaxUnits is the largest number of units any input may carry: a check's cost, a
// reservation's amount and used, a limit (plan, org override, team or user
// allocation), a grant and a counter adjustment. It is 2^50 (1,125,899,906,842,624).
// Redis runs the scripts in Lua, whose numbers are IEEE doubles, exact only up to
// 2^53; the bound leaves room for every sum a script makes: a counter never passes
// MaxCounter = 2 x MaxUnits (a count that would take it past is refused, even in
// shadow and warn mode), so counter + cost <= 3 x 2^50, a sliding window's two
// buckets plus a cost <= 5 x 2^50 and a commit's counter + over-reserved units
// <= 3 x 2^50, all below 2^53 (docs/ARCHITECTURE.md, "Bounded numbers").
const MaxUnits int64 = 1 << 50

// MaxCounter is the most any counter holds (2^51): the scripts refuse to count past
// it, read a stored value above it (old data) as MaxCounter, and a commit that would
// pass it stops there. Every limit is at most MaxUnits, so a counter at MaxCounter is
// over every limit.
const MaxCounter int64 = 2 * MaxUnits

// MaxValue is MaxUnits.
//
// Deprecated: use MaxUnits (kept so that code written against the old name builds).
const MaxValue = MaxUnits

// Window is the span a limit applies to. Second, minute, hour and day are sliding
// windows (two-bucket weighted counter); month is the org's billing period.
type Window string

// The windows a limit may use.
const (
	Second Window = "second"
	Minute Window = "minute"
	Hour   Window = "hour"
	Day    Window = "day"
	Month  Window = "month"
)

// slidingWindows lists the sliding windows from the narrowest to the broadest; a
// window's position is its index in the script's window list minus one.
var slidingWindows = [...]Window{Second, Minute, Hour, Day}

// Duration is the length of a sliding window, or 0 for Month (whose length depends on
// the calendar) and for an unknown window.
func (w Window) Duration() time.Duration {
	switch w {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	}
	return 0
}

// Valid reports whether w is one of the five windows.
func (w Window) Valid() bool { return w == Month || w.Duration() > 0 }

// seconds is the window length as the script sees it (and as it appears in bucket
// keys), constant strings so that passing them to Redis does not allocate.
func (w Window) seconds() string {
	switch w {
	case Second:
		return "1"
	case Minute:
		return "60"
	case Hour:
		return "3600"
	case Day:
		return "86400"
	}
	return ""
}

// windowBit maps a window to its bit in a set of windows; Month has none because it
// is always counted.
func (w Window) bit() uint8 {
	switch w {
	case Second:
		return 1
	case Minute:
		return 2
	case Hour:
		return 4
	case Day:
		return 8
	}
	return 0
}

// Level is one step of the org > team > user cascade.
type Level string

// The levels of the cascade.
const (
	LevelOrg  Level = "org"
	LevelTeam Level = "team"
	LevelUser Level = "user"
)

// letter is the level's one-letter code in counter fields and script replies.
func (l Level) letter() string {
	switch l {
	case LevelOrg:
		return "o"
	case LevelTeam:
		return "t"
	case LevelUser:
		return "u"
	}
	return ""
}

func levelOfLetter(s string) Level {
	switch s {
	case "o":
		return LevelOrg
	case "t":
		return LevelTeam
	case "u":
		return LevelUser
	}
	return ""
}

// Mode is an org's enforcement mode. All modes count usage; only Enforce denies.
type Mode string

// The enforcement modes.
const (
	// Enforce denies a check that would exceed a limit and counts nothing for it.
	Enforce Mode = "enforce"
	// Shadow never denies; a check that would have been denied is counted anyway and
	// reported in Result.WouldBlock.
	Shadow Mode = "shadow"
	// Warn behaves like Shadow; the HTTP layer adds a warning to the answer.
	Warn Mode = "warn"
)

// Limit caps the usage of one metric in one window at one level.
type Limit struct {
	Window Window
	Limit  int64
}

// LevelLimits holds the limits of one metric at each level, already resolved by the
// caller (plan, overrides, allocations, user defaults). A nil slice means the level
// has no limit for the metric; its usage is still counted.
type LevelLimits struct {
	Org  []Limit
	Team []Limit
	User []Limit
}

// Request asks whether Cost units of Metric may be spent now.
type Request struct {
	// Org is the tenant; required.
	Org string
	// Team is the team inside Org; empty for an org-level check.
	Team string
	// User is the end user inside Team; empty for a team- or org-level check. A user
	// counter is scoped by its team, so the same user id in two teams counts twice.
	User string
	// Metric is the metric to count, e.g. "requests"; required.
	Metric string
	// Cost is the number of units, 0 to query without consuming.
	Cost int64
	// IdempotencyKey, when set (8..128 characters of [A-Za-z0-9._:@-]), makes a repeat
	// of the check within 24 hours return the first decision without counting again.
	// Keys are scoped by Org. A repeat must be the same request (Team, User, Metric and
	// Cost as first given); any other fails with ErrIdempotencyConflict, counting nothing.
	IdempotencyKey string
	// Mode is the org's enforcement mode; empty means Enforce.
	Mode Mode
	// Limits are the limits of Metric at each present level.
	Limits LevelLimits
	// AnchorDay is the org's billing anchor day, 1..28; 0 means 1 (calendar month UTC).
	AnchorDay int
	// NoLease keeps the check out of leases (the org's plan or override says leases:
	// off): it is decided in Redis even when its path is hot.
	NoLease bool
}

// Validate reports every problem of the request, joined, each wrapping ErrInvalid.
func (r *Request) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...))
	}
	if !validID(r.Org) {
		bad("org %q is not a valid id", r.Org)
	}
	if r.Team != "" && !validID(r.Team) {
		bad("team %q is not a valid id", r.Team)
	}
	if r.User != "" {
		if !validID(r.User) {
			bad("user %q is not a valid id", r.User)
		}
		if r.Team == "" {
			bad("user %q needs its team", r.User)
		}
	}
	if !validID(r.Metric) {
		bad("metric %q is not a valid id", r.Metric)
	}
	if r.Cost < 0 || r.Cost > MaxUnits {
		bad("cost %d is outside 0..%d", r.Cost, MaxUnits)
	}
	if k := r.IdempotencyKey; k != "" && (len(k) < 8 || len(k) > 128 || !validChars(k)) {
		bad("idempotency key must be 8..128 characters of [A-Za-z0-9._:@-]")
	}
	switch r.Mode {
	case "", Enforce, Shadow, Warn:
	default:
		bad("mode %q is not enforce, shadow or warn", r.Mode)
	}
	if r.AnchorDay < 0 || r.AnchorDay > 28 {
		bad("billing anchor day %d is outside 1..28", r.AnchorDay)
	}
	checkLimits := func(level Level, present bool, limits []Limit) {
		if len(limits) > 0 && !present {
			bad("%s limits given for an absent %s", level, level)
			return
		}
		var seen uint8 // window bits, month as 16
		for _, l := range limits {
			if !l.Window.Valid() {
				bad("%s limit: unknown window %q", level, l.Window)
				continue
			}
			bit := l.Window.bit()
			if l.Window == Month {
				bit = 16
			}
			if seen&bit != 0 {
				bad("%s limit: window %s repeated", level, l.Window)
			}
			seen |= bit
			if l.Limit < 0 || l.Limit > MaxUnits {
				bad("%s limit %d per %s is outside 0..%d", level, l.Limit, l.Window, MaxUnits)
			}
		}
	}
	checkLimits(LevelOrg, true, r.Limits.Org)
	checkLimits(LevelTeam, r.Team != "", r.Limits.Team)
	checkLimits(LevelUser, r.User != "", r.Limits.User)
	return errors.Join(errs...)
}

// validID matches the API's id pattern ^[a-zA-Z0-9][a-zA-Z0-9._:@-]{0,127}$. Key
// layout relies on it: ids never contain '|', ';', '{' or '}'.
func validID(s string) bool {
	if len(s) == 0 || len(s) > 128 || !validChars(s) {
		return false
	}
	c := s[0]
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func validChars(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '.', c == '_', c == ':', c == '@', c == '-':
		default:
			return false
		}
	}
	return true
}

// Result is the decision of one check.
type Result struct {
	// Allowed is false only for a denied check in Enforce mode.
	Allowed bool
	// Levels has one entry per level and window with a limit, org first, usage
	// including this check's cost when it was counted.
	Levels []LevelStatus
	// BlockedAt names the limit that denied the check: the broadest window among
	// those exceeded, and at equal windows the highest level. Nil when allowed.
	BlockedAt *Blocked
	// WouldBlock is what BlockedAt would have been in Shadow or Warn mode, where the
	// check was allowed and counted anyway.
	WouldBlock *Blocked
	// RetryAfter estimates when the same check could pass; set only when denied.
	RetryAfter time.Duration
	// Replayed is true when an earlier check with the same idempotency key decided,
	// and this one consumed nothing.
	Replayed bool
	// Leased is true when the check was admitted in process from a lease this replica
	// holds (lease.go). Levels are then the usage when the lease was taken, counting the
	// whole lease as used (conservative), and are shared by the lease's answers: read only.
	Leased bool
}

// LevelStatus is the state of one limit after the check.
type LevelStatus struct {
	Level     Level
	ID        string
	Window    Window
	Limit     int64
	Used      int64
	Remaining int64
	ResetAt   time.Time
}

// Blocked names one limit: which level, whose id, which window.
type Blocked struct {
	Level  Level
	ID     string
	Window Window
}

// Counter names one month usage counter of an org.
type Counter struct {
	Metric string
	Level  Level
	// Team is set for team and user counters.
	Team string
	// User is set for user counters.
	User string
}

// field is the counter's hash field: metric|o, metric|t|team or metric|u|team|user.
func (c Counter) field() string {
	switch c.Level {
	case LevelOrg:
		return c.Metric + "|o"
	case LevelTeam:
		return c.Metric + "|t|" + c.Team
	default:
		return c.Metric + "|u|" + c.Team + "|" + c.User
	}
}
