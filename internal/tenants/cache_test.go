package tenants_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// twoReplicas returns two Services with their own pools and caches over one
// database, as two api replicas have.
func twoReplicas(t *testing.T, listen bool) (a, b *tenants.Service, ca, cb *tenants.Cache) {
	t.Helper()
	dbURL := testenv.PostgresURL(t)
	open := func() *tenants.Service {
		pool, err := pgxpool.New(context.Background(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	}
	a, b = open(), open()
	ca, cb = tenants.NewCache(a, tenants.CacheOptions{TTL: time.Hour}), tenants.NewCache(b, tenants.CacheOptions{TTL: time.Hour, KeyTTL: 2 * time.Second})
	if listen {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		ca.Listen(ctx, testenv.Redis(t))
		cb.Listen(ctx, testenv.Redis(t))
		time.Sleep(200 * time.Millisecond) // let both subscriptions settle
	}
	ctx := context.Background()
	if _, err := a.CreatePlan(ctx, op, tenants.PlanInput{ID: "pro", Name: "Pro", FailMode: vocab.FailClosed, Pool: "gold",
		Limits: []vocab.Limit{lim("requests", vocab.Month, 1000)}}); err != nil {
		t.Fatal(err)
	}
	org := testenv.ID(t, "org")
	if _, err := a.CreateOrg(ctx, op, tenants.OrgInput{ID: "acme", Name: org, PlanID: "pro"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateTeam(ctx, op, "acme", tenants.TeamInput{ID: "eng", Name: "Eng", Limits: []vocab.Limit{lim("requests", vocab.Month, 100)}}); err != nil {
		t.Fatal(err)
	}
	return a, b, ca, cb
}

func teamMonth(t *testing.T, c *tenants.Cache) int64 {
	t.Helper()
	o, err := c.Org(context.Background(), "acme")
	if err != nil {
		t.Fatal(err)
	}
	return o.Teams["eng"].Limits[0].Limit
}

// An allocation change made through one replica reaches the other's cache within a
// second, through Redis pub/sub (the TTL here is an hour).
func TestCacheInvalidationReachesOtherReplica(t *testing.T) {
	ctx := context.Background()
	a, _, _, cb := twoReplicas(t, true)
	if got := teamMonth(t, cb); got != 100 {
		t.Fatalf("team limit %d, want 100", got)
	}
	start := time.Now()
	if _, err := a.UpdateTeam(ctx, op, "acme", "eng", tenants.TeamPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Month, 250)}}); err != nil {
		t.Fatal(err)
	}
	for teamMonth(t, cb) != 250 {
		if time.Since(start) > time.Second {
			t.Fatal("the other replica still sees the old limit after 1s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the other replica saw the change after %v", time.Since(start))
}

// Without pub/sub at all, a revoked key stops authenticating within KeyTTL.
func TestRevokedKeyExpiresByTTLWithoutPubSub(t *testing.T) {
	ctx := context.Background()
	a, _, _, cb := twoReplicas(t, false)
	k, token, err := a.CreateAPIKey(ctx, op, "acme", tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Authenticate(ctx, token); err != nil {
		t.Fatal(err)
	}
	if err := a.RevokeAPIKey(ctx, op, "acme", k.ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		_, err := cb.Authenticate(ctx, token)
		if errors.Is(err, tenants.ErrBadToken) {
			break
		}
		if time.Since(start) > 3*time.Second {
			t.Fatalf("revoked key still accepted after %v (KeyTTL 2s)", time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("revoked key refused after %v", time.Since(start))
}

// With Postgres gone, cached entries keep answering.
func TestCacheServesStaleWhenPostgresIsDown(t *testing.T) {
	ctx := context.Background()
	dbURL := testenv.PostgresURL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	c := tenants.NewCache(svc, tenants.CacheOptions{TTL: time.Millisecond, KeyTTL: time.Millisecond})
	if _, err := svc.CreatePlan(ctx, op, tenants.PlanInput{ID: "pro", Name: "Pro", FailMode: vocab.FailOpen}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.CreateOrg(ctx, op, tenants.OrgInput{ID: "acme", Name: "Acme", PlanID: "pro"}); err != nil {
		t.Fatal(err)
	}
	_, token, err := svc.CreateAPIKey(ctx, op, "acme", tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Org(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Authenticate(ctx, token); err != nil {
		t.Fatal(err)
	}
	org, err := c.Org(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.User(ctx, org, "u1"); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	time.Sleep(5 * time.Millisecond) // past the TTL: every read tries Postgres and fails
	if o, err := c.Org(ctx, "acme"); err != nil || o.FailMode != vocab.FailOpen {
		t.Errorf("org with Postgres down: %+v, %v", o, err)
	}
	if k, err := c.Authenticate(ctx, token); err != nil || k.OrgID != "acme" {
		t.Errorf("key with Postgres down: %v", err)
	}
	if _, err := c.User(ctx, org, "u1"); err != nil {
		t.Errorf("user with Postgres down: %v", err)
	}
	if _, err := c.Org(ctx, "never-seen"); err == nil {
		t.Errorf("an org never cached resolved with Postgres down")
	}
}

// The invalidation channel follows QUOTA_REDIS_PREFIX: unchanged for the default,
// its own for any other, so installs sharing a Redis do not hear each other.
func TestChannelForPrefix(t *testing.T) {
	if got := tenants.ChannelFor("q"); got != tenants.InvalidationChannel {
		t.Errorf("ChannelFor(q) = %q, want %q", got, tenants.InvalidationChannel)
	}
	if a, b := tenants.ChannelFor("one"), tenants.ChannelFor("two"); a == b || a == tenants.InvalidationChannel {
		t.Errorf("ChannelFor(one) = %q, ChannelFor(two) = %q", a, b)
	}
}
