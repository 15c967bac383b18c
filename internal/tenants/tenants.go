package tenants

import (
	"time"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Leases says whether a plan's (or an org's) hot paths may be admitted in process
// from leases (quota's lease.go): LeasesAuto (the default) or LeasesOff. An org's
// LeasesPlan follows its plan. The same values say whether the org's clients may take
// client leases (ClientLeases, POST /v1/leases): LeasesOff answers every lease with
// no units, so every check of the org goes to the server.
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

// UnknownUsers says whether a check may name a user id its org has not registered:
// UnknownUsersAllow (an org's default) admits it with its team's user defaults,
// UnknownUsersRefuse refuses it with a 422 naming the team and the user, counting
// nothing. A team's UnknownUsersOrg (its default) follows its org's setting.
type UnknownUsers string

// The unknown-users settings.
const (
	UnknownUsersAllow  UnknownUsers = "allow"
	UnknownUsersRefuse UnknownUsers = "refuse"
	UnknownUsersOrg    UnknownUsers = "org" // a team's only: as its org says
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
	ID     string        `json:"id"`
	Name   string        `json:"name"`
	Limits []vocab.Limit `json:"limits"`
	// Metered lists metrics counted and billed without any limit, sorted. A check
	// names a metric of its org's limits, its plan's pricing or this list, or is
	// refused (see ErrUnknownMetric).
	Metered  []string       `json:"metered"`
	FailMode vocab.FailMode `json:"fail_mode"`
	Leases   Leases         `json:"leases"`
	// ClientLeases is LeasesAuto or LeasesOff: whether its orgs' clients may take
	// client leases (POST /v1/leases).
	ClientLeases Leases `json:"client_leases"`
	// SlidingWindows is WindowsEstimate or WindowsPrecise.
	SlidingWindows SlidingWindows `json:"sliding_windows"`
	Pool           string         `json:"pool"`
	Pricing        *Pricing       `json:"pricing"`
	// Weight is its orgs' part of a saturated capacity, 1 to vocab.MaxWeight (an org
	// may override it).
	Weight int64 `json:"weight"`
	// Features are the plan's entitlements (features.go), never nil.
	Features  Features  `json:"features"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`

	// Money: the rate card checks are priced at (rates.go). Currency is "" when the
	// plan has none.
	Currency string `json:"currency,omitempty"`
	Rates    []Rate `json:"rates"`
}

// Org is a tenant.
type Org struct {
	ID              string        `json:"id"`
	Name            string        `json:"name"`
	PlanID          string        `json:"plan"`
	Limits          []vocab.Limit `json:"limits"`           // overrides of the plan's limits
	EffectiveLimits []vocab.Limit `json:"effective_limits"` // plan limits with the overrides and active grants applied
	// Granted is the units of the org's active grants per metric, already added to
	// the month limits of EffectiveLimits; nil when it has none.
	Granted map[string]int64 `json:"granted,omitempty"`
	// GrantsLapse is when the first active grant lapses (zero: none): EffectiveLimits
	// hold until then, and a cached org is read again after it.
	GrantsLapse   time.Time  `json:"-"`
	Mode          vocab.Mode `json:"mode"`
	Oversubscribe bool       `json:"oversubscribe"`
	Leases        Leases     `json:"leases"` // LeasesPlan: as its plan says
	// ClientLeases is LeasesPlan (as its plan says), LeasesAuto or LeasesOff: whether
	// the org's clients may take client leases (POST /v1/leases).
	ClientLeases Leases `json:"client_leases"`
	// SlidingWindows is WindowsPlan (as its plan says), WindowsEstimate or WindowsPrecise.
	SlidingWindows SlidingWindows `json:"sliding_windows"`
	// UnknownUsers is UnknownUsersAllow or UnknownUsersRefuse: whether checks of the
	// org's teams (those that follow it) may name unregistered users.
	UnknownUsers     UnknownUsers `json:"unknown_users"`
	WebhookURL       string       `json:"webhook_url"`
	RedisURL         string       `json:"redis_url,omitempty"`
	BillingAnchorDay int          `json:"billing_anchor_day"`
	// Weight overrides its plan's weight, 1 to vocab.MaxWeight; 0 follows the plan.
	Weight    int64     `json:"weight,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Team is part of an org, with its own allocation and the default limits of its
// users that have none of their own.
type Team struct {
	OrgID      string        `json:"org"`
	ID         string        `json:"id"`
	Name       string        `json:"name"`
	Limits     []vocab.Limit `json:"limits"`
	UserLimits []vocab.Limit `json:"user_limits"`
	// UnknownUsers is UnknownUsersOrg (as its org says), UnknownUsersAllow or
	// UnknownUsersRefuse: whether its checks may name unregistered users.
	UnknownUsers UnknownUsers `json:"unknown_users"`
	// Weight is its part of an org limit marked fair_share, 1 to vocab.MaxWeight.
	Weight    int64     `json:"weight"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// RefusesUnknownUsers says whether checks naming a user id that org o has not
// registered are refused under team t: the team's own setting when it has one, else
// the org's.
func RefusesUnknownUsers(o Org, t Team) bool {
	switch t.UnknownUsers {
	case UnknownUsersAllow:
		return false
	case UnknownUsersRefuse:
		return true
	}
	return o.UnknownUsers == UnknownUsersRefuse
}

// User is a registered end user of a customer, inside one team. A user id is unique
// within its org.
type User struct {
	OrgID     string        `json:"org"`
	TeamID    string        `json:"team"`
	ID        string        `json:"id"`
	Limits    []vocab.Limit `json:"limits"`
	CreatedAt time.Time     `json:"created_at"`
	UpdatedAt time.Time     `json:"updated_at"`
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
