// Package tenants owns the tenancy model of Quotaplane: plans and their limits, orgs
// with overrides, teams and users with allocations carved out of their parent's,
// API keys, console users and the audit log. Its Service validates every change,
// enforces the allocation rules inside the same Postgres transaction as the write,
// and records an audit row for it.
package tenants

import (
	"regexp"
	"time"
)

// idPattern is the shape of every caller-chosen id (plans, orgs, teams, users, metrics).
var idPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._:@-]{0,127}$`)

// ValidID reports whether s is a valid caller-chosen id: idPattern, checked by hand
// because it runs several times on every check (the regexp was 4 % of a check's CPU).
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 128 || !alnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !alnum(c) && c != '.' && c != '_' && c != ':' && c != '@' && c != '-' {
			return false
		}
	}
	return true
}

func alnum(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }

// Window is the time span a limit applies to.
type Window string

// The windows a limit may have. Month is the org's billing period; the others are
// sliding windows.
const (
	Second Window = "second"
	Minute Window = "minute"
	Hour   Window = "hour"
	Day    Window = "day"
	Month  Window = "month"
)

// Windows lists every window, shortest first.
var Windows = []Window{Second, Minute, Hour, Day, Month}

// Valid reports whether w is a known window.
func (w Window) Valid() bool {
	switch w {
	case Second, Minute, Hour, Day, Month:
		return true
	}
	return false
}

// Limit caps the units of one metric in one window.
type Limit struct {
	Metric string `json:"metric"`
	Window Window `json:"window"`
	Limit  int64  `json:"limit"`
}

// FailMode says how checks of a plan's orgs are answered while Redis is unreachable.
type FailMode string

// The fail modes.
const (
	FailOpen   FailMode = "open"   // allow, flagged degraded
	FailClosed FailMode = "closed" // answer 503
	FailLocal  FailMode = "local"  // decide with an in-process limiter
)

// Leases says whether a plan's (or an org's) hot paths may be admitted in process
// from leases (quota's lease.go): LeasesAuto (the default) or LeasesOff. An org's
// LeasesPlan follows its plan.
type Leases string

// The lease settings.
const (
	LeasesAuto Leases = "auto"
	LeasesOff  Leases = "off"
	LeasesPlan Leases = "plan" // an org's only: as its plan says
)

// SlidingWindows says how a plan's (or an org's) sliding windows are counted (quota's
// check.lua): WindowsEstimate (the default), the two-bucket estimate, which a real
// span of one window can pass by up to the limit again; or WindowsPrecise, in
// sub-buckets, which no real span of a window passes (docs/ARCHITECTURE.md "Sliding
// windows"). An org's WindowsPlan follows its plan.
type SlidingWindows string

// The sliding window settings.
const (
	WindowsEstimate SlidingWindows = "estimate"
	WindowsPrecise  SlidingWindows = "precise"
	WindowsPlan     SlidingWindows = "plan" // an org's only: as its plan says
)

// Mode is an org's enforcement mode.
type Mode string

// The enforcement modes.
const (
	Enforce Mode = "enforce" // deny over quota
	Shadow  Mode = "shadow"  // never deny, report would_block
	Warn    Mode = "warn"    // allow, add a warning header
)

// Scope is a permission of an API key.
type Scope string

// The scopes of API keys.
const (
	ScopeCheck   Scope = "check"
	ScopeAdmin   Scope = "admin"
	ScopeBilling Scope = "billing"
)

// Role is a console user's permission within an org.
type Role string

// The console roles.
const (
	RoleAdmin  Role = "admin"
	RoleViewer Role = "viewer"
)

// Pricing is what a plan's org pays per period.
type Pricing struct {
	Currency  string        `json:"currency"`
	BasePrice string        `json:"base_price"` // decimal, per period
	Metrics   []MetricPrice `json:"metrics"`
}

// MetricPrice prices one metric: units up to IncludedUnits are in the base price,
// each unit above costs OveragePrice.
type MetricPrice struct {
	Metric        string `json:"metric"`
	IncludedUnits int64  `json:"included_units"`
	OveragePrice  string `json:"overage_price"` // decimal, per unit
}

// Plan is a named bundle of limits that orgs subscribe to.
type Plan struct {
	ID     string  `json:"id"`
	Name   string  `json:"name"`
	Limits []Limit `json:"limits"`
	// Metered lists metrics counted and billed without any limit, sorted. A check
	// names a metric of its org's limits, its plan's pricing or this list, or is
	// refused (see ErrUnknownMetric).
	Metered  []string `json:"metered"`
	FailMode FailMode `json:"fail_mode"`
	Leases   Leases   `json:"leases"`
	// SlidingWindows is WindowsEstimate or WindowsPrecise.
	SlidingWindows SlidingWindows `json:"sliding_windows"`
	Pool           string         `json:"pool"`
	Pricing        *Pricing       `json:"pricing"`
	CreatedAt      time.Time      `json:"created_at"`
	UpdatedAt      time.Time      `json:"updated_at"`
}

// Org is a tenant.
type Org struct {
	ID              string  `json:"id"`
	Name            string  `json:"name"`
	PlanID          string  `json:"plan"`
	Limits          []Limit `json:"limits"`           // overrides of the plan's limits
	EffectiveLimits []Limit `json:"effective_limits"` // plan limits with the overrides and active grants applied
	// Granted is the units of the org's active grants per metric, already added to
	// the month limits of EffectiveLimits; nil when it has none.
	Granted map[string]int64 `json:"granted,omitempty"`
	// GrantsLapse is when the first active grant lapses (zero: none): EffectiveLimits
	// hold until then, and a cached org is read again after it.
	GrantsLapse   time.Time `json:"-"`
	Mode          Mode      `json:"mode"`
	Oversubscribe bool      `json:"oversubscribe"`
	Leases        Leases    `json:"leases"` // LeasesPlan: as its plan says
	// SlidingWindows is WindowsPlan (as its plan says), WindowsEstimate or WindowsPrecise.
	SlidingWindows   SlidingWindows `json:"sliding_windows"`
	WebhookURL       string         `json:"webhook_url"`
	RedisURL         string         `json:"redis_url,omitempty"`
	BillingAnchorDay int            `json:"billing_anchor_day"`
	CreatedAt        time.Time      `json:"created_at"`
	UpdatedAt        time.Time      `json:"updated_at"`
}

// Team is part of an org, with its own allocation and the default limits of its
// users that have none of their own.
type Team struct {
	OrgID      string    `json:"org"`
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Limits     []Limit   `json:"limits"`
	UserLimits []Limit   `json:"user_limits"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// User is a registered end user of a customer, inside one team. A user id is unique
// within its org.
type User struct {
	OrgID     string    `json:"org"`
	TeamID    string    `json:"team"`
	ID        string    `json:"id"`
	Limits    []Limit   `json:"limits"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// APIKey is an org's API key as it can be shown: never its secret.
type APIKey struct {
	ID         string     `json:"id"`
	OrgID      string     `json:"org"`
	Name       string     `json:"name"`
	Prefix     string     `json:"prefix"`
	Scopes     []Scope    `json:"scopes"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
}

// HasScope reports whether k carries scope s.
func (k APIKey) HasScope(s Scope) bool {
	for _, have := range k.Scopes {
		if have == s {
			return true
		}
	}
	return false
}

// ConsoleUser is an org admin or viewer of the web console, without the password hash.
type ConsoleUser struct {
	ID        string    `json:"id"`
	OrgID     string    `json:"org"`
	Email     string    `json:"email"`
	Role      Role      `json:"role"`
	CreatedAt time.Time `json:"created_at"`
}

// AuditEntry is one recorded change.
type AuditEntry struct {
	ID        int64     `json:"id"`
	OrgID     string    `json:"org"`
	Actor     string    `json:"actor"`
	Action    string    `json:"action"`
	Object    string    `json:"object"`
	Before    []byte    `json:"before"` // JSON, nil when created
	After     []byte    `json:"after"`  // JSON, nil when deleted
	RequestID string    `json:"request_id"`
	Time      time.Time `json:"time"`
}

// Actor is who makes a change, as recorded in the audit log.
type Actor struct {
	Name      string // "operator", "key:<id>", "console:<email>"
	RequestID string
}

// Page asks for one page of a list: at most Limit items after the opaque Cursor.
type Page struct {
	Limit  int
	Cursor string
}
