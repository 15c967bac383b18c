// Package demo creates, idempotently, the demo plan, org, teams, users, console
// account and API key that `make run` prints, so a newcomer can try every call at once.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The demo's fixed names.
const (
	PlanID       = "demo-pro"
	OrgID        = "demo"
	ConsoleEmail = "admin@demo.test"
)

// Result is what the demo prints.
type Result struct {
	// ID is the state directory's identity (a random id kept in it, demo-id): its
	// demo key is named "demo <ID>", and a console account it makes after another
	// state directory took ConsoleEmail is admin-<ID>@demo.test.
	ID     string
	OrgKey string // an org key with scopes check, admin, billing
	// ConsoleEmail and ConsolePassword sign in to the console (org OrgID). The
	// password is "" when the account's password was changed since this state
	// directory set it (ConsoleNote says how to get a new one).
	ConsoleEmail    string
	ConsolePassword string
	ConsoleNote     string
}

var seedActor = tenants.Actor{Name: "demo-seed"}

func limit(m string, w vocab.Window, n int64) vocab.Limit {
	return vocab.Limit{Metric: m, Window: w, Limit: n}
}

// ignoreExists makes "already there" a success, which is what makes Seed idempotent.
func ignoreExists(err error) error {
	if errors.Is(err, tenants.ErrExists) {
		return nil
	}
	return err
}

// Seed creates what is missing of the demo, and the credentials of stateDir.
//
// Several state directories (two clones, say) may seed one database; none rewrites
// credentials another made, so the first clone's printed ones keep working. Each state
// directory gets an identity (a random id kept in it), its own org key, named "demo
// <id>", and its own console account: ConsoleEmail when it is free, else
// admin-<id>@demo.test. The key and the password are kept in stateDir (mode 0600), so
// later runs print the same ones. A key of the state directory that no longer works is
// replaced, and the keys it replaces (its identity's other keys) are revoked; a console
// account it made that was deleted is made again; one whose password was changed
// meanwhile is left alone, and Result.ConsoleNote says how to get a new one.
func Seed(ctx context.Context, svc *tenants.Service, stateDir string) (Result, error) {
	_, err := svc.CreatePlan(ctx, seedActor, tenants.PlanInput{ID: PlanID, Name: "Demo Pro", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{limit("requests", vocab.Month, 100000), limit("requests", vocab.Minute, 600),
			limit("tokens", vocab.Month, 5000000)},
		Metered: []string{"gpu_seconds"}, // counted and billed, never limited
		Pricing: &tenants.Pricing{Currency: "USD", BasePrice: "49.00", Metrics: []tenants.MetricPrice{
			{Metric: "requests", IncludedUnits: 100000, OveragePrice: "0.001"}}}})
	if err := ignoreExists(err); err != nil {
		return Result{}, fmt.Errorf("demo plan: %w", err)
	}
	_, err = svc.CreateOrg(ctx, seedActor, tenants.OrgInput{ID: OrgID, Name: "Demo Inc.", PlanID: PlanID})
	if err := ignoreExists(err); err != nil {
		return Result{}, fmt.Errorf("demo org: %w", err)
	}
	teams := []tenants.TeamInput{
		{ID: "eng", Name: "Engineering", Limits: []vocab.Limit{limit("requests", vocab.Month, 60000), limit("requests", vocab.Minute, 400)},
			UserLimits: []vocab.Limit{limit("requests", vocab.Month, 5000), limit("requests", vocab.Minute, 60)}},
		{ID: "sales", Name: "Sales", Limits: []vocab.Limit{limit("requests", vocab.Month, 20000)},
			UserLimits: []vocab.Limit{limit("requests", vocab.Month, 1000)}},
	}
	for _, t := range teams {
		if _, err := svc.CreateTeam(ctx, seedActor, OrgID, t); ignoreExists(err) != nil {
			return Result{}, fmt.Errorf("demo team %s: %w", t.ID, err)
		}
	}
	if _, err := svc.CreateUser(ctx, seedActor, OrgID, "eng", tenants.UserInput{ID: "alice",
		Limits: []vocab.Limit{limit("requests", vocab.Month, 20000)}}); ignoreExists(err) != nil {
		return Result{}, fmt.Errorf("demo user: %w", err)
	}
	if _, err := svc.CreateUser(ctx, seedActor, OrgID, "sales", tenants.UserInput{ID: "bob"}); ignoreExists(err) != nil {
		return Result{}, fmt.Errorf("demo user: %w", err)
	}

	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return Result{}, err
	}
	var res Result
	if res.ID, err = identity(stateDir); err != nil {
		return Result{}, err
	}
	if err := consoleAccount(ctx, svc, stateDir, &res); err != nil {
		return Result{}, err
	}
	if err := orgKey(ctx, svc, stateDir, &res); err != nil {
		return Result{}, err
	}
	return res, nil
}

// identity returns the state directory's id, making one the first time.
func identity(stateDir string) (string, error) {
	idFile := filepath.Join(stateDir, "demo-id")
	if id := readState(idFile); id != "" {
		return id, nil
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	if err := os.WriteFile(idFile, []byte(id), 0o600); err != nil {
		return "", err
	}
	return id, nil
}

// consoleAccount finds or makes the state directory's console account.
func consoleAccount(ctx context.Context, svc *tenants.Service, stateDir string, res *Result) error {
	pwFile := filepath.Join(stateDir, "demo-console-password")
	emailFile := filepath.Join(stateDir, "demo-console-email")
	res.ConsolePassword = readState(pwFile)
	res.ConsoleEmail = readState(emailFile)
	if res.ConsolePassword != "" && res.ConsoleEmail == "" {
		res.ConsoleEmail = ConsoleEmail // a state directory from before identities
	}
	if res.ConsolePassword != "" {
		if _, err := svc.VerifyConsoleLogin(ctx, OrgID, res.ConsoleEmail, res.ConsolePassword); err == nil {
			return nil
		}
		// Deleted meanwhile: make it again, with the password this directory keeps.
		_, err := svc.CreateConsoleUser(ctx, seedActor, OrgID, tenants.ConsoleUserInput{Email: res.ConsoleEmail,
			Password: res.ConsolePassword, Role: tenants.RoleAdmin})
		if errors.Is(err, tenants.ErrExists) {
			// Its password was changed since: not this run's to change back.
			res.ConsolePassword = ""
			res.ConsoleNote = fmt.Sprintf("the password of %s was changed since %s kept it; to get a new one, delete that "+
				"console user (DELETE /v1/orgs/%s/console-users/{id} with the demo org key) and run make run again",
				res.ConsoleEmail, pwFile, OrgID)
			return nil
		}
		if err != nil {
			return fmt.Errorf("demo console user: %w", err)
		}
		return nil
	}
	res.ConsolePassword = randomString(18)
	var err error
	for _, email := range []string{ConsoleEmail, "admin-" + res.ID + "@demo.test"} {
		res.ConsoleEmail = email
		_, err = svc.CreateConsoleUser(ctx, seedActor, OrgID, tenants.ConsoleUserInput{Email: email,
			Password: res.ConsolePassword, Role: tenants.RoleAdmin})
		if !errors.Is(err, tenants.ErrExists) {
			break // made, or failed; an account another state directory made is left alone
		}
	}
	if err != nil {
		return fmt.Errorf("demo console user: %w", err)
	}
	if err := os.WriteFile(emailFile, []byte(res.ConsoleEmail), 0o600); err != nil {
		return err
	}
	return os.WriteFile(pwFile, []byte(res.ConsolePassword), 0o600)
}

// orgKey finds or makes the state directory's org key; a new one revokes the keys of
// the same identity it replaces.
func orgKey(ctx context.Context, svc *tenants.Service, stateDir string, res *Result) error {
	keyFile := filepath.Join(stateDir, "demo-org-key")
	res.OrgKey = readState(keyFile)
	if k, err := svc.Authenticate(ctx, res.OrgKey); err == nil && k.OrgID == OrgID {
		return nil
	}
	name := "demo " + res.ID
	k, token, err := svc.CreateAPIKey(ctx, seedActor, OrgID, tenants.APIKeyInput{Name: name,
		Scopes: []tenants.Scope{tenants.ScopeCheck, tenants.ScopeAdmin, tenants.ScopeBilling}})
	if err != nil {
		return fmt.Errorf("demo key: %w", err)
	}
	if err := os.WriteFile(keyFile, []byte(token), 0o600); err != nil {
		return err
	}
	res.OrgKey = token
	// The keys this one replaces: the identity's others still in force.
	cursor := ""
	for {
		keys, next, err := svc.ListAPIKeys(ctx, OrgID, tenants.Page{Limit: 100, Cursor: cursor})
		if err != nil {
			return fmt.Errorf("demo keys: %w", err)
		}
		for _, old := range keys {
			if old.Name == name && old.ID != k.ID && old.RevokedAt == nil {
				if err := svc.RevokeAPIKey(ctx, seedActor, OrgID, old.ID); err != nil {
					return fmt.Errorf("revoke the demo key it replaces: %w", err)
				}
			}
		}
		if cursor = next; cursor == "" {
			return nil
		}
	}
}

func readState(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func randomString(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}
