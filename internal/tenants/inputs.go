package tenants

import (
	"net/mail"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// PlanInput creates a plan.
type PlanInput struct {
	ID       string
	Name     string
	Limits   []vocab.Limit
	Metered  []string // metrics counted and billed without a limit
	FailMode vocab.FailMode
	Leases   Leases // "" means auto
	// ClientLeases "" means auto.
	ClientLeases Leases
	// SlidingWindows "" means estimate.
	SlidingWindows SlidingWindows
	Pool           string // "" means "default"
	Pricing        *Pricing
	Features       Features // nil: none
	Weight         int64    // 0 means 1

	// Money: the rate card; Currency "" means none.
	Currency string
	Rates    []Rate
}

// PlanPatch changes the fields that are set. Limits replaces the whole list.
type PlanPatch struct {
	Name           *string
	Limits         *[]vocab.Limit
	Metered        *[]string // replaces the whole list
	FailMode       *vocab.FailMode
	Leases         *Leases
	ClientLeases   *Leases
	SlidingWindows *SlidingWindows
	Pool           *string
	Pricing        *Pricing
	// RemovePricing drops the plan's pricing (the request sent "pricing": null).
	RemovePricing bool
	Features      *Features // replaces the whole object
	Weight        *int64

	// Money: Currency and Rates replace the plan's when set.
	Currency *string
	Rates    *[]Rate
}

// OrgInput creates an org.
type OrgInput struct {
	ID               string
	Name             string
	PlanID           string
	Limits           []vocab.Limit
	Mode             vocab.Mode // "" means enforce
	Oversubscribe    bool
	Leases           Leases         // "" means plan
	ClientLeases     Leases         // "" means plan
	SlidingWindows   SlidingWindows // "" means plan
	UnknownUsers     UnknownUsers   // "" means allow
	WebhookURL       string
	RedisURL         string
	BillingAnchorDay int // 0 means 1
}

// OrgPatch changes the fields that are set. Limits replaces all overrides.
type OrgPatch struct {
	Name             *string
	PlanID           *string
	Limits           *[]vocab.Limit
	Mode             *vocab.Mode
	Oversubscribe    *bool
	Leases           *Leases
	ClientLeases     *Leases
	SlidingWindows   *SlidingWindows
	UnknownUsers     *UnknownUsers
	WebhookURL       *string
	RedisURL         *string
	BillingAnchorDay *int
	// Weight overrides the plan's weight; RemoveWeight (the request sent "weight":
	// null) follows the plan again.
	Weight       *int64
	RemoveWeight bool
}

// OperatorOnly names the fields of p that only the operator may change.
func (p OrgPatch) OperatorOnly() []string {
	var f []string
	if p.PlanID != nil {
		f = append(f, "plan")
	}
	if p.Limits != nil {
		f = append(f, "limits")
	}
	if p.RedisURL != nil {
		f = append(f, "redis_url")
	}
	if p.Leases != nil {
		f = append(f, "leases")
	}
	if p.ClientLeases != nil {
		f = append(f, "client_leases")
	}
	if p.SlidingWindows != nil {
		f = append(f, "sliding_windows")
	}
	if p.BillingAnchorDay != nil {
		f = append(f, "billing_anchor_day")
	}
	if p.Weight != nil || p.RemoveWeight {
		f = append(f, "weight")
	}
	return f
}

// TeamInput creates a team.
type TeamInput struct {
	ID           string
	Name         string
	Limits       []vocab.Limit
	UserLimits   []vocab.Limit
	UnknownUsers UnknownUsers // "" means org
	Weight       int64        // 0 means 1
}

// TeamPatch changes the fields that are set; limit lists are replaced whole.
type TeamPatch struct {
	Name         *string
	Limits       *[]vocab.Limit
	UserLimits   *[]vocab.Limit
	UnknownUsers *UnknownUsers
	Weight       *int64
}

// UserInput registers a user in a team.
type UserInput struct {
	ID     string
	Limits []vocab.Limit
}

// UserPatch replaces a user's own limits when set.
type UserPatch struct {
	Limits *[]vocab.Limit
}

// APIKeyInput creates an API key.
type APIKeyInput struct {
	Name   string
	Scopes []Scope
}

// ConsoleUserInput creates a console user.
type ConsoleUserInput struct {
	Email    string
	Password string
	Role     Role
}

func checkID(errs *fieldErrs, field, id string) {
	if !vocab.ValidID(id) {
		errs.add(field, vocab.IDRule)
	}
}

func checkName(errs *fieldErrs, field, name string) {
	if n := utf8.RuneCountInString(strings.TrimSpace(name)); n < 1 || n > 200 {
		errs.add(field, "must be 1 to 200 characters")
	}
}

func checkFailMode(errs *fieldErrs, m vocab.FailMode) {
	switch m {
	case vocab.FailOpen, vocab.FailClosed, vocab.FailLocal:
	default:
		errs.add("fail_mode", "must be one of open, closed, local")
	}
}

// checkLeases checks a lease setting, field leases or client_leases.
func checkLeases(errs *fieldErrs, field string, l Leases, org bool) {
	switch {
	case l == LeasesAuto, l == LeasesOff:
	case org && l == LeasesPlan:
	case org:
		errs.add(field, "must be one of plan, auto, off")
	default:
		errs.add(field, "must be one of auto, off")
	}
}

func checkSlidingWindows(errs *fieldErrs, w SlidingWindows, org bool) {
	switch {
	case w == WindowsEstimate, w == WindowsPrecise:
	case org && w == WindowsPlan:
	case org:
		errs.add("sliding_windows", "must be one of plan, estimate, precise")
	default:
		errs.add("sliding_windows", "must be one of estimate, precise")
	}
}

func checkUnknownUsers(errs *fieldErrs, u UnknownUsers, team bool) {
	switch {
	case u == UnknownUsersAllow, u == UnknownUsersRefuse:
	case team && u == UnknownUsersOrg:
	case team:
		errs.add("unknown_users", "must be one of org, allow, refuse")
	default:
		errs.add("unknown_users", "must be one of allow, refuse")
	}
}

func checkMode(errs *fieldErrs, m vocab.Mode) {
	switch m {
	case vocab.Enforce, vocab.Shadow, vocab.Warn:
	default:
		errs.add("mode", "must be one of enforce, shadow, warn")
	}
}

func checkWebhook(errs *fieldErrs, s string) {
	if s == "" {
		return
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(s) > 2000 {
		errs.add("webhook_url", "must be an absolute http or https URL")
	}
}

func checkRedisURL(errs *fieldErrs, s string) {
	if s == "" {
		return
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		errs.add("redis_url", "must be a redis:// or rediss:// URL")
	}
}

func checkWeight(errs *fieldErrs, w int64) {
	if w < 1 || w > vocab.MaxWeight {
		errs.add("weight", "must be 1 to %d", vocab.MaxWeight)
	}
}

func checkAnchor(errs *fieldErrs, d int) {
	if d < 1 || d > 28 {
		errs.add("billing_anchor_day", "must be 1 to 28")
	}
}

// Validate reports every problem of in.
func (in PlanInput) Validate() error {
	var errs fieldErrs
	checkID(&errs, "id", in.ID)
	checkName(&errs, "name", in.Name)
	validateOrgLimits(&errs, "limits", in.Limits)
	validateMetered(&errs, in.Metered)
	checkFailMode(&errs, in.FailMode)
	if in.Leases != "" {
		checkLeases(&errs, "leases", in.Leases, false)
	}
	if in.ClientLeases != "" {
		checkLeases(&errs, "client_leases", in.ClientLeases, false)
	}
	if in.SlidingWindows != "" {
		checkSlidingWindows(&errs, in.SlidingWindows, false)
	}
	if in.Pool != "" {
		checkID(&errs, "pool", in.Pool)
	}
	validatePricing(&errs, in.Pricing)
	validateFeatures(&errs, "features", in.Features, false)
	if in.Weight != 0 {
		checkWeight(&errs, in.Weight)
	}
	validateRateCard(&errs, in.Currency, in.Rates, in.Limits) // money
	return errs.err()
}

// Validate reports every problem of p.
func (p PlanPatch) Validate() error {
	var errs fieldErrs
	if p.Name != nil {
		checkName(&errs, "name", *p.Name)
	}
	if p.Limits != nil {
		validateOrgLimits(&errs, "limits", *p.Limits)
	}
	if p.Metered != nil {
		validateMetered(&errs, *p.Metered)
	}
	if p.FailMode != nil {
		checkFailMode(&errs, *p.FailMode)
	}
	if p.Leases != nil {
		checkLeases(&errs, "leases", *p.Leases, false)
	}
	if p.ClientLeases != nil {
		checkLeases(&errs, "client_leases", *p.ClientLeases, false)
	}
	if p.SlidingWindows != nil {
		checkSlidingWindows(&errs, *p.SlidingWindows, false)
	}
	if p.Pool != nil {
		checkID(&errs, "pool", *p.Pool)
	}
	validatePricing(&errs, p.Pricing)
	if p.Features != nil {
		validateFeatures(&errs, "features", *p.Features, false)
	}
	if p.Weight != nil {
		checkWeight(&errs, *p.Weight)
	}
	if p.Rates != nil { // money; with the currency, checked whole in UpdatePlan
		validateRates(&errs, "rates", *p.Rates)
	}
	if p.Currency != nil && *p.Currency != "" && !ValidCurrency(*p.Currency) {
		errs.add("currency", "must be an ISO 4217 code in capitals such as USD")
	}
	return errs.err()
}

// Validate reports every problem of in.
func (in OrgInput) Validate() error {
	var errs fieldErrs
	checkID(&errs, "id", in.ID)
	checkName(&errs, "name", in.Name)
	checkID(&errs, "plan", in.PlanID)
	validateOrgLimits(&errs, "limits", in.Limits)
	if in.Mode != "" {
		checkMode(&errs, in.Mode)
	}
	if in.Leases != "" {
		checkLeases(&errs, "leases", in.Leases, true)
	}
	if in.ClientLeases != "" {
		checkLeases(&errs, "client_leases", in.ClientLeases, true)
	}
	if in.SlidingWindows != "" {
		checkSlidingWindows(&errs, in.SlidingWindows, true)
	}
	if in.UnknownUsers != "" {
		checkUnknownUsers(&errs, in.UnknownUsers, false)
	}
	checkWebhook(&errs, in.WebhookURL)
	checkRedisURL(&errs, in.RedisURL)
	if in.BillingAnchorDay != 0 {
		checkAnchor(&errs, in.BillingAnchorDay)
	}
	return errs.err()
}

// Validate reports every problem of p.
func (p OrgPatch) Validate() error {
	var errs fieldErrs
	if p.Name != nil {
		checkName(&errs, "name", *p.Name)
	}
	if p.PlanID != nil {
		checkID(&errs, "plan", *p.PlanID)
	}
	if p.Limits != nil {
		validateOrgLimits(&errs, "limits", *p.Limits)
	}
	if p.Mode != nil {
		checkMode(&errs, *p.Mode)
	}
	if p.Leases != nil {
		checkLeases(&errs, "leases", *p.Leases, true)
	}
	if p.ClientLeases != nil {
		checkLeases(&errs, "client_leases", *p.ClientLeases, true)
	}
	if p.SlidingWindows != nil {
		checkSlidingWindows(&errs, *p.SlidingWindows, true)
	}
	if p.UnknownUsers != nil {
		checkUnknownUsers(&errs, *p.UnknownUsers, false)
	}
	if p.WebhookURL != nil {
		checkWebhook(&errs, *p.WebhookURL)
	}
	if p.RedisURL != nil {
		checkRedisURL(&errs, *p.RedisURL)
	}
	if p.BillingAnchorDay != nil {
		checkAnchor(&errs, *p.BillingAnchorDay)
	}
	if p.Weight != nil {
		checkWeight(&errs, *p.Weight)
	}
	return errs.err()
}

// Validate reports every problem of in.
func (in TeamInput) Validate() error {
	var errs fieldErrs
	checkID(&errs, "id", in.ID)
	checkName(&errs, "name", in.Name)
	validateLimits(&errs, "limits", in.Limits)
	validateLimits(&errs, "user_limits", in.UserLimits)
	if in.UnknownUsers != "" {
		checkUnknownUsers(&errs, in.UnknownUsers, true)
	}
	if in.Weight != 0 {
		checkWeight(&errs, in.Weight)
	}
	return errs.err()
}

// Validate reports every problem of p.
func (p TeamPatch) Validate() error {
	var errs fieldErrs
	if p.Name != nil {
		checkName(&errs, "name", *p.Name)
	}
	if p.Limits != nil {
		validateLimits(&errs, "limits", *p.Limits)
	}
	if p.UserLimits != nil {
		validateLimits(&errs, "user_limits", *p.UserLimits)
	}
	if p.UnknownUsers != nil {
		checkUnknownUsers(&errs, *p.UnknownUsers, true)
	}
	if p.Weight != nil {
		checkWeight(&errs, *p.Weight)
	}
	return errs.err()
}

// Validate reports every problem of in.
func (in UserInput) Validate() error {
	var errs fieldErrs
	checkID(&errs, "id", in.ID)
	validateLimits(&errs, "limits", in.Limits)
	return errs.err()
}

// Validate reports every problem of p.
func (p UserPatch) Validate() error {
	var errs fieldErrs
	if p.Limits != nil {
		validateLimits(&errs, "limits", *p.Limits)
	}
	return errs.err()
}

// Validate reports every problem of in.
func (in APIKeyInput) Validate() error {
	var errs fieldErrs
	checkName(&errs, "name", in.Name)
	if len(in.Scopes) == 0 {
		errs.add("scopes", "must name at least one of check, admin, billing")
	}
	seen := map[Scope]bool{}
	for _, s := range in.Scopes {
		switch s {
		case ScopeCheck, ScopeAdmin, ScopeBilling:
		default:
			errs.add("scopes", "unknown scope %q: must be check, admin or billing", s)
		}
		if seen[s] {
			errs.add("scopes", "repeats %q", s)
		}
		seen[s] = true
	}
	return errs.err()
}

// Validate reports every problem of in.
func (in ConsoleUserInput) Validate() error {
	var errs fieldErrs
	if a, err := mail.ParseAddress(in.Email); err != nil || a.Address != in.Email || len(in.Email) > 254 {
		errs.add("email", "must be a plain email address such as admin@example.com")
	}
	if n := utf8.RuneCountInString(in.Password); n < 12 || n > 200 {
		errs.add("password", "must be 12 to 200 characters")
	}
	if in.Role != RoleAdmin && in.Role != RoleViewer {
		errs.add("role", "must be admin or viewer")
	}
	return errs.err()
}
