package tenants_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

// fakeNow is a clock a test moves by hand.
type fakeNow struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeNow) Now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeNow) Add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

// Keys in use are kept fresh in batches, off the check path: a key authenticated
// past half its TTL is revalidated with the others in one query, so at the end of
// its TTL it is served with no lookup of its own (a cache that looked each key up
// again would make one query per key per TTL: at 100,000 orgs, 833 a second). A key
// revoked behind the cache's back (no invalidation) is still refused within the TTL.
func TestCacheRefreshesKeysInOneQueryOffTheCheckPath(t *testing.T) {
	const ttl = 2 * time.Minute
	e := newCacheEnv(t, tenants.CacheOptions{TTL: time.Hour, KeyTTL: ttl})
	clock := &fakeNow{t: time.Now()}
	tenants.SetCacheClock(e.cache, clock.Now)
	ctx := context.Background()
	const n = 20
	ids, tokens := make([]string, n), make([]string, n)
	for i := range n {
		org := fmt.Sprintf("org-%d", i)
		e.org(t, org)
		k, tok, err := e.svc.CreateAPIKey(ctx, op, org, tenants.APIKeyInput{Name: "k", Scopes: []tenants.Scope{tenants.ScopeCheck}})
		if err != nil {
			t.Fatal(err)
		}
		ids[i], tokens[i] = k.ID, tok
	}
	auth := func(i int) error {
		_, err := e.cache.Authenticate(ctx, tokens[i])
		return err
	}
	tenants.RefreshKeysNow(ctx, e.cache) // nothing queued yet: no query
	for i := range n {
		if err := auth(i); err != nil {
			t.Fatal(err)
		}
	}
	clock.Add(ttl/2 + time.Second)
	before := e.queries()
	for i := range n {
		if err := auth(i); err != nil { // served, and queued for the refresh
			t.Fatal(err)
		}
	}
	if q := e.queries() - before; q != 0 {
		t.Fatalf("%d queries authenticating cached keys, want 0", q)
	}
	// Revoked behind the cache's back: only the refresh can learn of it.
	if _, err := e.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, ids[0]); err != nil {
		t.Fatal(err)
	}
	before = e.queries()
	tenants.RefreshKeysNow(ctx, e.cache)
	if q := e.queries() - before; q != 1 {
		t.Errorf("the refresh of %d keys made %d queries, want 1", n, q)
	}
	clock.Add(ttl/2 + time.Second) // past the TTL of the first lookups
	before = e.queries()
	for i := 1; i < n; i++ {
		if err := auth(i); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if q := e.queries() - before; q != 0 {
		t.Errorf("%d queries authenticating %d refreshed keys past their first TTL, want 0", q, n-1)
	}
	if err := auth(0); !errors.Is(err, tenants.ErrBadToken) {
		t.Errorf("the revoked key: %v, want ErrBadToken", err)
	}
}
