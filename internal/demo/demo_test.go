package demo_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/demo"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

func activeKeys(t *testing.T, svc *tenants.Service) []tenants.APIKey {
	t.Helper()
	keys, _, err := svc.ListAPIKeys(context.Background(), demo.OrgID, tenants.Page{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var out []tenants.APIKey
	for _, k := range keys {
		if k.RevokedAt == nil {
			out = append(out, k)
		}
	}
	return out
}

func signsIn(t *testing.T, svc *tenants.Service, r demo.Result) {
	t.Helper()
	if _, err := svc.VerifyConsoleLogin(context.Background(), demo.OrgID, r.ConsoleEmail, r.ConsolePassword); err != nil {
		t.Errorf("console sign-in as %s: %v", r.ConsoleEmail, err)
	}
	if k, err := svc.Authenticate(context.Background(), r.OrgKey); err != nil || k.OrgID != demo.OrgID {
		t.Errorf("demo key: %+v, %v", k, err)
	}
}

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
	if second.ConsoleEmail != demo.ConsoleEmail {
		t.Errorf("the first state dir's console account is %s, want %s", second.ConsoleEmail, demo.ConsoleEmail)
	}
	signsIn(t, svc, second)
	keys, _, _ := svc.ListAPIKeys(ctx, demo.OrgID, tenants.Page{})
	if len(keys) != 1 || keys[0].Name != "demo "+second.ID {
		t.Errorf("keys after two runs: %+v, want one named %q", keys, "demo "+second.ID)
	}
	// A revoked demo key is replaced.
	k, _ := svc.Authenticate(ctx, second.OrgKey)
	if err := svc.RevokeAPIKey(ctx, tenants.Actor{Name: "t"}, demo.OrgID, k.ID); err != nil {
		t.Fatal(err)
	}
	third, err := demo.Seed(ctx, svc, dir)
	if err != nil || third.OrgKey == second.OrgKey {
		t.Fatalf("revoked key not replaced: %v", err)
	}
	signsIn(t, svc, third)
}

// A second state directory on the same database (another clone) gets credentials of
// its own and leaves the first one's working: the console password is not reset and
// no key is added to the first's.
func TestSeedOfAnotherStateDirRewritesNoCredentials(t *testing.T) {
	ctx := context.Background()
	svc := tenants.NewService(testenv.Postgres(t), tenants.WithPasswordCost(64, 1))
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := demo.Seed(ctx, svc, dirA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := demo.Seed(ctx, svc, dirB)
	if err != nil {
		t.Fatal(err)
	}
	signsIn(t, svc, a)
	signsIn(t, svc, b)
	if a.ID == b.ID || a.OrgKey == b.OrgKey || a.ConsoleEmail == b.ConsoleEmail {
		t.Errorf("two state dirs share an identity, key or account: %+v / %+v", a, b)
	}
	if want := "admin-" + b.ID + "@demo.test"; b.ConsoleEmail != want {
		t.Errorf("second console account %s, want %s", b.ConsoleEmail, want)
	}
	// And again, in any order: still the same, still working, one key each.
	for _, dir := range []string{dirB, dirA, dirB} {
		if _, err := demo.Seed(ctx, svc, dir); err != nil {
			t.Fatal(err)
		}
	}
	a2, _ := demo.Seed(ctx, svc, dirA)
	if a2 != a {
		t.Errorf("state dir A printed other credentials after B's runs: %+v, was %+v", a2, a)
	}
	signsIn(t, svc, a)
	signsIn(t, svc, b)
	if n := len(activeKeys(t, svc)); n != 2 {
		t.Errorf("%d keys in force after five runs of two state dirs, want 2", n)
	}
}

// A state directory whose key no longer works (here: a damaged file) gets a new one,
// and the key it replaces is revoked: keys do not pile up.
func TestSeedRevokesTheKeyItReplaces(t *testing.T) {
	ctx := context.Background()
	svc := tenants.NewService(testenv.Postgres(t), tenants.WithPasswordCost(64, 1))
	dir := t.TempDir()
	first, err := demo.Seed(ctx, svc, dir)
	if err != nil {
		t.Fatal(err)
	}
	other, err := demo.Seed(ctx, svc, t.TempDir()) // another state dir's key must stay
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "demo-org-key"), []byte("qpk_damaged"), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := demo.Seed(ctx, svc, dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.OrgKey == first.OrgKey {
		t.Fatal("the damaged key was kept")
	}
	signsIn(t, svc, again)
	signsIn(t, svc, other)
	if _, err := svc.Authenticate(ctx, first.OrgKey); err == nil {
		t.Error("the replaced key still works")
	}
	if n := len(activeKeys(t, svc)); n != 2 {
		t.Errorf("%d keys in force, want 2 (one per state dir)", n)
	}
}

// A console password changed by someone else is not changed back: the seed says so,
// and how to get a new one.
func TestSeedLeavesAChangedPasswordAlone(t *testing.T) {
	ctx := context.Background()
	svc := tenants.NewService(testenv.Postgres(t), tenants.WithPasswordCost(64, 1))
	dir := t.TempDir()
	if _, err := demo.Seed(ctx, svc, dir); err != nil {
		t.Fatal(err)
	}
	if err := svc.SetConsolePassword(ctx, tenants.Actor{Name: "t"}, demo.OrgID, demo.ConsoleEmail, "someone else's password"); err != nil {
		t.Fatal(err)
	}
	r, err := demo.Seed(ctx, svc, dir)
	if err != nil {
		t.Fatal(err)
	}
	if r.ConsolePassword != "" || !strings.Contains(r.ConsoleNote, "console-users") {
		t.Errorf("result %+v: want no password and a note on how to get one", r)
	}
	if _, err := svc.VerifyConsoleLogin(ctx, demo.OrgID, demo.ConsoleEmail, "someone else's password"); err != nil {
		t.Errorf("the changed password was rewritten: %v", err)
	}
}
