package tenants_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// cacheEnv is a Service with a cache on a fresh database, the pool they share (its
// acquire count is the number of Postgres queries made) and the cache's metrics.
type cacheEnv struct {
	svc   *tenants.Service
	pool  *pgxpool.Pool
	cache *tenants.Cache
	reg   *prometheus.Registry
}

func newCacheEnv(t *testing.T, o tenants.CacheOptions) *cacheEnv {
	t.Helper()
	pool := testenv.Postgres(t)
	e := &cacheEnv{pool: pool, reg: prometheus.NewRegistry()}
	e.svc = tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	o.Metrics = cachemetrics.New(e.reg)
	e.cache = tenants.NewCache(e.svc, o)
	ctx := context.Background()
	if _, err := e.svc.CreatePlan(ctx, op, tenants.PlanInput{ID: "pro", Name: "Pro", FailMode: vocab.FailOpen,
		Limits: []vocab.Limit{lim("requests", vocab.Month, 1000)}}); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *cacheEnv) org(t *testing.T, id string, users ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := e.svc.CreateOrg(ctx, op, tenants.OrgInput{ID: id, Name: id, PlanID: "pro"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.CreateTeam(ctx, op, id, tenants.TeamInput{ID: "eng", Name: "Eng", Limits: []vocab.Limit{lim("requests", vocab.Month, 500)}}); err != nil {
		t.Fatal(err)
	}
	for _, u := range users {
		if _, err := e.svc.CreateUser(ctx, op, id, "eng", tenants.UserInput{ID: u, Limits: []vocab.Limit{lim("requests", vocab.Month, 10)}}); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *cacheEnv) queries() int64 { return e.pool.Stat().AcquireCount() }

// count reads a cache counter: "evictions" of a cache, or "lookups" of a cache with
// a result (hit or miss).
func (e *cacheEnv) count(name, cache string, result ...string) float64 {
	family, want := "quotaplane_cache_evictions_total", map[string]string{"cache": cache}
	if name == "lookups" {
		family, want = "quotaplane_cache_lookups_total", map[string]string{"cache": cache, "result": result[0]}
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want[lp.GetName()] != lp.GetValue() {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func (e *cacheEnv) user(t *testing.T, orgID, userID string) tenants.ResolvedUser {
	t.Helper()
	ctx := context.Background()
	org, err := e.cache.Org(ctx, orgID)
	if err != nil {
		t.Fatal(err)
	}
	u, err := e.cache.User(ctx, org, userID)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// After the org is resolved, user ids cost no Postgres query, registered or not: the
// org carries its registered users.
func TestCacheUnknownUsersCostNoQuery(t *testing.T) {
	e := newCacheEnv(t, tenants.CacheOptions{TTL: time.Hour})
	e.org(t, "acme", "alice", "bob")
	if u := e.user(t, "acme", "alice"); !u.Registered || u.TeamID != "eng" || len(u.Limits) != 1 || u.Limits[0].Limit != 10 {
		t.Fatalf("alice = %+v", u)
	}
	before := e.queries()
	for i := range 2000 {
		if u := e.user(t, "acme", fmt.Sprintf("visitor-%d", i)); u.Registered {
			t.Fatalf("visitor-%d registered: %+v", i, u)
		}
	}
	if u := e.user(t, "acme", "bob"); !u.Registered {
		t.Fatalf("bob = %+v", u)
	}
	if n := e.queries() - before; n != 0 {
		t.Errorf("2,001 user lookups after warm-up made %d Postgres queries, want 0", n)
	}
}

// Registering, changing and removing a user reaches the cache of the replica that
// made the change at once, and another replica's through pub/sub.
func TestCacheUserChangesInvalidate(t *testing.T) {
	ctx := context.Background()
	a, _, ca, cb := twoReplicas(t, true)
	get := func(c *tenants.Cache) tenants.ResolvedUser {
		t.Helper()
		org, err := c.Org(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		u, err := c.User(ctx, org, "carol")
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	eventually := func(what string, want tenants.ResolvedUser) {
		t.Helper()
		if got := get(ca); !cmp.Equal(got, want, cmpopts.EquateEmpty()) {
			t.Fatalf("%s: this replica sees %+v, want %+v", what, got, want)
		}
		for start := time.Now(); !cmp.Equal(get(cb), want, cmpopts.EquateEmpty()); time.Sleep(5 * time.Millisecond) {
			if time.Since(start) > 2*time.Second {
				t.Fatalf("%s: the other replica still sees %+v after 2s", what, get(cb))
			}
		}
	}
	eventually("before", tenants.ResolvedUser{})
	if _, err := a.CreateUser(ctx, op, "acme", "eng", tenants.UserInput{ID: "carol", Limits: []vocab.Limit{lim("requests", vocab.Month, 40)}}); err != nil {
		t.Fatal(err)
	}
	eventually("registered", tenants.ResolvedUser{Registered: true, TeamID: "eng", Limits: []vocab.Limit{lim("requests", vocab.Month, 40)}})
	if _, err := a.UpdateUser(ctx, op, "acme", "eng", "carol", tenants.UserPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Month, 60)}}); err != nil {
		t.Fatal(err)
	}
	eventually("changed", tenants.ResolvedUser{Registered: true, TeamID: "eng", Limits: []vocab.Limit{lim("requests", vocab.Month, 60)}})
	if err := a.DeleteUser(ctx, op, "acme", "eng", "carol"); err != nil {
		t.Fatal(err)
	}
	eventually("removed", tenants.ResolvedUser{})
}

// An org with more registered users than a tenth of the Users bound is resolved
// without them; its user ids are looked up once each, then served from the per-user
// cache (unregistered ones too), and a registration still invalidates them.
func TestCacheLargeOrgLooksUsersUpOnce(t *testing.T) {
	ctx := context.Background()
	e := newCacheEnv(t, tenants.CacheOptions{TTL: time.Hour, Users: 20}) // at most 2 users carried
	e.org(t, "big", "u1", "u2", "u3")
	org, err := e.cache.Org(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	if org.UsersComplete || org.Users != nil {
		t.Fatalf("an org of 3 users carried them with a bound of 2: %+v", org.Users)
	}
	if u := e.user(t, "big", "u2"); !u.Registered {
		t.Fatalf("u2 = %+v", u)
	}
	if u := e.user(t, "big", "stranger"); u.Registered {
		t.Fatalf("stranger = %+v", u)
	}
	before := e.queries()
	for range 10 {
		e.user(t, "big", "u2")
		e.user(t, "big", "stranger")
	}
	if n := e.queries() - before; n != 0 {
		t.Errorf("cached user lookups made %d queries", n)
	}
	if hit, miss := e.count("lookups", "users", "hit"), e.count("lookups", "users", "miss"); hit != 20 || miss != 2 {
		t.Errorf("users cache: %v hits, %v misses; want 20, 2", hit, miss)
	}
	if _, err := e.svc.CreateUser(ctx, op, "big", "eng", tenants.UserInput{ID: "stranger"}); err != nil {
		t.Fatal(err)
	}
	if u := e.user(t, "big", "stranger"); !u.Registered {
		t.Errorf("a cached unregistered id served after its registration: %+v", u)
	}
}

// With Postgres gone, the per-user cache of a large org serves its expired entries.
func TestCacheLargeOrgUsersServeStaleWhenPostgresIsDown(t *testing.T) {
	ctx := context.Background()
	e := newCacheEnv(t, tenants.CacheOptions{TTL: time.Millisecond, Users: 20})
	e.org(t, "big", "u1", "u2", "u3")
	org, err := e.cache.Org(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"u2", "stranger"} {
		if _, err := e.cache.User(ctx, org, id); err != nil {
			t.Fatal(err)
		}
	}
	e.pool.Close()
	time.Sleep(5 * time.Millisecond) // past the TTL: every read tries Postgres and fails
	if u, err := e.cache.User(ctx, org, "u2"); err != nil || !u.Registered {
		t.Errorf("registered user with Postgres down: %+v, %v", u, err)
	}
	if u, err := e.cache.User(ctx, org, "stranger"); err != nil || u.Registered {
		t.Errorf("unregistered id with Postgres down: %+v, %v", u, err)
	}
	if _, err := e.cache.User(ctx, org, "never-seen"); err == nil {
		t.Errorf("a user id never cached resolved with Postgres down")
	}
}

// Every part of the cache holds at most its bound and counts what it evicts.
func TestCacheBoundsEvict(t *testing.T) {
	ctx := context.Background()
	e := newCacheEnv(t, tenants.CacheOptions{TTL: time.Hour, KeyTTL: time.Hour, Orgs: 3, Users: 20, Keys: 2, Negative: 2})
	for i := range 5 {
		e.org(t, fmt.Sprintf("o%d", i))
	}
	for i := range 5 {
		if _, err := e.cache.Org(ctx, fmt.Sprintf("o%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.count("evictions", "orgs"); got != 2 {
		t.Errorf("5 orgs through a cache of 3: %v evictions, want 2", got)
	}
	// The most recent three are kept: no query for them, one for an evicted one.
	before := e.queries()
	for _, id := range []string{"o2", "o3", "o4"} {
		if _, err := e.cache.Org(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.queries() - before; n != 0 {
		t.Errorf("the three most recent orgs made %d queries", n)
	}
	if _, err := e.cache.Org(ctx, "o0"); err != nil || e.queries() == before {
		t.Errorf("an evicted org was served without a query (%v)", err)
	}

	// Registered users carried by the orgs count against Users too: with room for 20,
	// 10 orgs of 2 users fit, the 11th and 12th push one out each.
	e2 := newCacheEnv(t, tenants.CacheOptions{TTL: time.Hour, Orgs: 100, Users: 20})
	for i := range 12 {
		e2.org(t, fmt.Sprintf("p%d", i), "a", "b")
		if _, err := e2.cache.Org(ctx, fmt.Sprintf("p%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := e2.count("evictions", "orgs"); got != 2 {
		t.Errorf("12 orgs of 2 users with a bound of 20 users: %v evictions, want 2", got)
	}

	// Keys (2) and bad tokens (2 apart): a flood of bad tokens does not push keys out.
	var tokens []string
	for i := range 3 {
		_, tok, err := e.svc.CreateAPIKey(ctx, op, "o4", tenants.APIKeyInput{Name: fmt.Sprint(i), Scopes: []tenants.Scope{tenants.ScopeCheck}})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tok)
	}
	for _, tok := range tokens {
		if _, err := e.cache.Authenticate(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.count("evictions", "keys"); got != 1 {
		t.Errorf("3 keys through a cache of 2: %v evictions, want 1", got)
	}
	for i := range 5 {
		bad := tokens[0][:len(tokens[0])-5] + fmt.Sprintf("%04dA", i) // well formed, wrong secret
		if _, err := e.cache.Authenticate(ctx, bad); !errors.Is(err, tenants.ErrBadToken) {
			t.Fatalf("bad token: %v", err)
		}
	}
	if got := e.count("evictions", "bad_tokens"); got != 3 {
		t.Errorf("5 bad tokens through a cache of 2: %v evictions, want 3", got)
	}
	before = e.queries()
	for _, tok := range tokens[1:] {
		if _, err := e.cache.Authenticate(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.queries() - before; n != 0 {
		t.Errorf("the two cached keys made %d queries after a flood of bad tokens", n)
	}
}

// Under concurrent reads, a change is never hidden by what was read before it: once
// UpdateTeam returns, every read of this replica sees the new limit, even from a
// lookup that was in flight during the change.
func TestCacheConcurrentInvalidation(t *testing.T) {
	ctx := context.Background()
	// One org fits: acme and other push each other out, so lookups of acme are
	// always in flight, before, during and after each change.
	e := newCacheEnv(t, tenants.CacheOptions{TTL: time.Hour, Orgs: 1, Users: 10})
	e.org(t, "acme", "alice")
	e.org(t, "other")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := []string{"acme", "other", "third"}[(g+i)%3]
				org, err := e.cache.Org(ctx, id)
				if errors.Is(err, tenants.ErrNotFound) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := e.cache.User(ctx, org, fmt.Sprint("u", i%50)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for n := int64(100); n < 130; n++ {
		if _, err := e.svc.UpdateTeam(ctx, op, "acme", "eng", tenants.TeamPatch{Limits: &[]vocab.Limit{lim("requests", vocab.Month, n)}}); err != nil {
			t.Fatal(err)
		}
		org, err := e.cache.Org(ctx, "acme")
		if err != nil {
			t.Fatal(err)
		}
		if got := org.Teams["eng"].Limits[0].Limit; got != n {
			t.Fatalf("after setting %d the cache serves %d", n, got)
		}
	}
}

// The new user ids of a large org (one resolved without its users) missed at once are
// looked up in batches: a burst of 64 costs a few queries, not 64, and each id gets
// its own answer (registered with its limits, or not).
func TestCacheLargeOrgUserLookupsBatched(t *testing.T) {
	ctx := context.Background()
	e := newCacheEnv(t, tenants.CacheOptions{TTL: time.Hour, Users: 20}) // at most 2 users carried
	e.org(t, "big", "u1", "u2", "u3")
	org, err := e.cache.Org(ctx, "big")
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	before := e.queries()
	start := make(chan struct{})
	got := make([]tenants.ResolvedUser, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			id := fmt.Sprintf("n%02d", i)
			if i%16 == 0 {
				id = fmt.Sprintf("u%d", 1+i/16%3)
			}
			got[i], errs[i] = e.cache.User(ctx, org, id)
		})
	}
	close(start)
	wg.Wait()
	queries := e.queries() - before
	t.Logf("%d concurrent new user ids of a large org: %d queries", n, queries)
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if reg := i%16 == 0; got[i].Registered != reg || reg && (got[i].TeamID != "eng" || len(got[i].Limits) != 1) {
			t.Errorf("user %d = %+v, registered %v expected", i, got[i], reg)
		}
	}
	if queries > n/4 {
		t.Errorf("%d concurrent new user ids cost %d queries, want at most %d (batched)", n, queries, n/4)
	}
}

// Negative results are cached: an unknown org id and a well-formed token that is no
// key cost one query, then none, until an org or a key is created, which every replica
// hears of (Service.OnChange, pub/sub).
func TestCacheNegativeResultsUntilCreated(t *testing.T) {
	ctx := context.Background()
	e := newCacheEnv(t, tenants.CacheOptions{})
	e.org(t, "known")
	_, tok, err := e.svc.CreateAPIKey(ctx, op, "known", tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}})
	if err != nil {
		t.Fatal(err)
	}
	bad := tok[:len(tok)-5] + "0000A" // well formed, wrong secret
	for i := range 3 {
		before := e.queries()
		if _, err := e.cache.Org(ctx, "later"); !errors.Is(err, tenants.ErrNotFound) {
			t.Fatalf("unknown org: %v, want ErrNotFound", err)
		}
		if _, err := e.cache.Authenticate(ctx, bad); !errors.Is(err, tenants.ErrBadToken) {
			t.Fatalf("bad token: %v, want ErrBadToken", err)
		}
		if n := e.queries() - before; i == 0 && n == 0 || i > 0 && n != 0 {
			t.Fatalf("round %d: %d queries for an unknown org and a bad token; want some the first time, then none", i, n)
		}
	}
	e.org(t, "later") // creating the org moves its generation: found at once
	if _, err := e.cache.Org(ctx, "later"); err != nil {
		t.Fatalf("org created after a miss: %v", err)
	}
	if _, _, err := e.svc.CreateAPIKey(ctx, op, "later", tenants.APIKeyInput{Name: "k2", Scopes: []tenants.Scope{tenants.ScopeCheck}}); err != nil {
		t.Fatal(err)
	}
	before := e.queries()
	if _, err := e.cache.Authenticate(ctx, bad); !errors.Is(err, tenants.ErrBadToken) || e.queries() == before {
		t.Fatalf("a bad token after a key was created: %v, %d queries; want looked up again", err, e.queries()-before)
	}
}

// The orgs are bounded by an estimate of their memory as well as by count: with a
// budget of a few orgs' worth, the least recently used go.
func TestCacheOrgsBoundedByMemory(t *testing.T) {
	ctx := context.Background()
	users := make([]string, 40)
	for i := range users {
		users[i] = fmt.Sprintf("user-%03d", i)
	}
	e := newCacheEnv(t, tenants.CacheOptions{TTL: time.Hour, Memory: 3 * 10_000})
	for i := range 6 {
		e.org(t, fmt.Sprintf("m%d", i), users...) // ~8 KB each by the estimate
		if _, err := e.cache.Org(ctx, fmt.Sprintf("m%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.count("evictions", "orgs"); got < 2 || got > 4 {
		t.Errorf("6 orgs of ~8 KB through a budget of 30 KB: %v evictions, want 2 to 4", got)
	}
	before := e.queries()
	if _, err := e.cache.Org(ctx, "m5"); err != nil || e.queries() != before {
		t.Errorf("the newest org: %v, %d queries; want served from memory", err, e.queries()-before)
	}
}
