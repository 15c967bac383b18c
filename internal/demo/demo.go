// Package demo creates, idempotently, the demo plan, org, teams, users, console
// account and API key that `make run` prints, so a newcomer can try every call at once.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/base64"
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
	OrgKey          string // an org key with scopes check, admin, billing
	ConsolePassword string
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

// Seed creates what is missing of the demo. The org key and console password are
// kept in stateDir (mode 0600) so later runs print the same ones; a key that was
// revoked meanwhile is replaced.
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
	pwFile := filepath.Join(stateDir, "demo-console-password")
	res.ConsolePassword = readState(pwFile)
	if res.ConsolePassword == "" {
		res.ConsolePassword = randomString(18)
		_, err := svc.CreateConsoleUser(ctx, seedActor, OrgID, tenants.ConsoleUserInput{Email: ConsoleEmail,
			Password: res.ConsolePassword, Role: tenants.RoleAdmin})
		if errors.Is(err, tenants.ErrExists) {
			// The account exists but this state directory never knew its password (a
			// new clone on an old database): the demo owns the account, so reset it.
			err = svc.SetConsolePassword(ctx, seedActor, OrgID, ConsoleEmail, res.ConsolePassword)
		}
		if err != nil {
			return Result{}, fmt.Errorf("demo console user: %w", err)
		}
		if err := os.WriteFile(pwFile, []byte(res.ConsolePassword), 0o600); err != nil {
			return Result{}, err
		}
	}
	keyFile := filepath.Join(stateDir, "demo-org-key")
	res.OrgKey = readState(keyFile)
	if k, err := svc.Authenticate(ctx, res.OrgKey); err != nil || k.OrgID != OrgID {
		_, token, err := svc.CreateAPIKey(ctx, seedActor, OrgID, tenants.APIKeyInput{Name: "demo",
			Scopes: []tenants.Scope{tenants.ScopeCheck, tenants.ScopeAdmin, tenants.ScopeBilling}})
		if err != nil {
			return Result{}, fmt.Errorf("demo key: %w", err)
		}
		res.OrgKey = token
		if err := os.WriteFile(keyFile, []byte(token), 0o600); err != nil {
			return Result{}, err
		}
	}
	return res, nil
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
