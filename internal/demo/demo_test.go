package demo_test

import (
	"context"
	"testing"

	"github.com/quotaplane/quotaplane/internal/demo"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Seeding twice creates nothing new and prints the same working key.
func TestSeedIsIdempotent(t *testing.T) {
	ctx := context.Background()
	svc := tenants.NewService(testenv.Postgres(t), tenants.WithPasswordCost(64, 1))
	dir := t.TempDir()
	first, err := demo.Seed(ctx, svc, dir)
	if err != nil {
		t.Fatal(err)
	}
	second, err := demo.Seed(ctx, svc, dir)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("second run printed other credentials")
	}
	k, err := svc.Authenticate(ctx, second.OrgKey)
	if err != nil || k.OrgID != demo.OrgID {
		t.Fatalf("demo key: %+v, %v", k, err)
	}
	keys, _, _ := svc.ListAPIKeys(ctx, demo.OrgID, tenants.Page{})
	if len(keys) != 1 {
		t.Errorf("%d keys after two runs, want 1", len(keys))
	}
	if _, err := svc.VerifyConsoleLogin(ctx, demo.ConsoleEmail, second.ConsolePassword); err != nil {
		t.Errorf("console login: %v", err)
	}
	// A revoked demo key is replaced.
	if err := svc.RevokeAPIKey(ctx, tenants.Actor{Name: "t"}, demo.OrgID, k.ID); err != nil {
		t.Fatal(err)
	}
	third, err := demo.Seed(ctx, svc, dir)
	if err != nil || third.OrgKey == second.OrgKey {
		t.Fatalf("revoked key not replaced: %v", err)
	}
}

// A new state directory on an old database (a fresh clone, say) still prints a
// console password that works.
func TestSeedWithLostStateResetsTheConsolePassword(t *testing.T) {
	ctx := context.Background()
	svc := tenants.NewService(testenv.Postgres(t), tenants.WithPasswordCost(64, 1))
	if _, err := demo.Seed(ctx, svc, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	again, err := demo.Seed(ctx, svc, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.VerifyConsoleLogin(ctx, demo.ConsoleEmail, again.ConsolePassword); err != nil {
		t.Fatalf("the printed password does not sign in: %v", err)
	}
}
