package tenants

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// InvalidationChannel is the Redis pub/sub channel on which replicas announce the
// orgs they changed.
const InvalidationChannel = "quotaplane:invalidate"

// Cache keeps resolved orgs, users and API keys in memory, so a check in steady state
// costs no Postgres query. Entries are dropped when their org changes: at once in the
// replica that made the change (through Service.OnChange), and within a moment in
// every other replica through Redis pub/sub (Listen). A TTL bounds staleness should a
// message be lost; API keys live at most KeyTTL, so a revoked key stops working within
// that time everywhere. When Postgres cannot be reached, stale entries keep serving.
type Cache struct {
	svc    *Service
	ttl    time.Duration
	keyTTL time.Duration
	log    *slog.Logger
	now    func() time.Time

	mu    sync.RWMutex
	gen   map[string]uint64 // per org, bumped by every invalidation
	orgs  map[string]*orgEntry
	users map[[2]string]*userEntry
	keys  map[[32]byte]*keyEntry
	sf    singleflight.Group

	hits, misses func() // metric hooks
}

type orgEntry struct {
	val     ResolvedOrg
	gen     uint64
	fetched time.Time
}

type userEntry struct {
	val     ResolvedUser
	gen     uint64
	fetched time.Time
}

type keyEntry struct {
	val     APIKey
	err     error // ErrBadToken, cached briefly
	gen     uint64
	fetched time.Time
}

// CacheOptions tunes a Cache.
type CacheOptions struct {
	TTL    time.Duration // default 30s
	KeyTTL time.Duration // default 5s
	Logger *slog.Logger
	Hit    func() // called on a cache hit (metrics)
	Miss   func() // called on a miss
}

// NewCache returns a cache over svc and subscribes it to svc's changes.
func NewCache(svc *Service, o CacheOptions) *Cache {
	if o.TTL <= 0 {
		o.TTL = 30 * time.Second
	}
	if o.KeyTTL <= 0 {
		o.KeyTTL = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	noop := func() {}
	if o.Hit == nil {
		o.Hit = noop
	}
	if o.Miss == nil {
		o.Miss = noop
	}
	c := &Cache{svc: svc, ttl: o.TTL, keyTTL: o.KeyTTL, log: o.Logger, now: time.Now,
		gen: map[string]uint64{}, orgs: map[string]*orgEntry{}, users: map[[2]string]*userEntry{},
		keys: map[[32]byte]*keyEntry{}, hits: o.Hit, misses: o.Miss}
	svc.OnChange(c.Invalidate)
	return c
}

// Invalidate drops every entry of the orgs named.
func (c *Cache) Invalidate(orgIDs ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range orgIDs {
		c.gen[id]++
		delete(c.orgs, id)
	}
	if len(orgIDs) == 0 {
		return
	}
	drop := map[string]bool{}
	for _, id := range orgIDs {
		drop[id] = true
	}
	for k := range c.users {
		if drop[k[0]] {
			delete(c.users, k)
		}
	}
	for k, e := range c.keys {
		if drop[e.val.OrgID] {
			delete(c.keys, k)
		}
	}
}

// InvalidateAll drops everything, e.g. after the pub/sub connection was lost.
func (c *Cache) InvalidateAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.orgs {
		c.gen[id]++
	}
	for k := range c.users {
		c.gen[k[0]]++
	}
	c.orgs = map[string]*orgEntry{}
	c.users = map[[2]string]*userEntry{}
	c.keys = map[[32]byte]*keyEntry{}
}

// isDown reports whether err means Postgres could not answer (as opposed to "no such
// thing"), in which case a stale entry is better than no answer.
func isDown(err error) bool {
	return err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBadToken) && !errors.Is(err, context.Canceled)
}

// Org returns the resolved org.
func (c *Cache) Org(ctx context.Context, orgID string) (ResolvedOrg, error) {
	c.mu.RLock()
	e, gen := c.orgs[orgID], c.gen[orgID]
	c.mu.RUnlock()
	if e != nil && c.now().Sub(e.fetched) < c.ttl {
		c.hits()
		return e.val, nil
	}
	c.misses()
	v, err, _ := c.sf.Do("o\x00"+orgID, func() (any, error) { return c.svc.ResolveOrg(ctx, orgID) })
	if err != nil {
		if e != nil && isDown(err) {
			c.log.Warn("serving a stale org: Postgres unavailable", "org", orgID, "err", err.Error())
			return e.val, nil
		}
		return ResolvedOrg{}, err
	}
	c.mu.Lock()
	if c.gen[orgID] == gen {
		c.orgs[orgID] = &orgEntry{val: v.(ResolvedOrg), gen: gen, fetched: c.now()}
	}
	c.mu.Unlock()
	return v.(ResolvedOrg), nil
}

// User returns what is known of a user id of an org.
func (c *Cache) User(ctx context.Context, orgID, userID string) (ResolvedUser, error) {
	k := [2]string{orgID, userID}
	c.mu.RLock()
	e, gen := c.users[k], c.gen[orgID]
	c.mu.RUnlock()
	if e != nil && c.now().Sub(e.fetched) < c.ttl {
		c.hits()
		return e.val, nil
	}
	c.misses()
	v, err, _ := c.sf.Do("u\x00"+orgID+"\x00"+userID, func() (any, error) { return c.svc.ResolveUser(ctx, orgID, userID) })
	if err != nil {
		if e != nil && isDown(err) {
			return e.val, nil
		}
		return ResolvedUser{}, err
	}
	c.mu.Lock()
	if c.gen[orgID] == gen {
		c.users[k] = &userEntry{val: v.(ResolvedUser), gen: gen, fetched: c.now()}
	}
	c.mu.Unlock()
	return v.(ResolvedUser), nil
}

// Authenticate is Service.Authenticate through the cache: a token is looked up in
// Postgres at most once per KeyTTL. Bad tokens are remembered as briefly, so a
// burst of them does not reach Postgres each time.
func (c *Cache) Authenticate(ctx context.Context, token string) (APIKey, error) {
	return c.AuthenticateHashed(ctx, token, sha256.Sum256([]byte(token)))
}

// AuthenticateHashed is Authenticate for a caller that already has the token's
// SHA-256 (the HTTP layer computes it once per request for the operator check).
func (c *Cache) AuthenticateHashed(ctx context.Context, token string, k [32]byte) (APIKey, error) {
	if !LooksLikeAPIKey(token) {
		return APIKey{}, ErrBadToken
	}
	c.mu.RLock()
	e := c.keys[k]
	c.mu.RUnlock()
	if e != nil && c.now().Sub(e.fetched) < c.keyTTL {
		c.hits()
		return e.val, e.err
	}
	c.misses()
	v, err, _ := c.sf.Do("k\x00"+string(k[:]), func() (any, error) { return c.svc.Authenticate(ctx, token) })
	if isDown(err) {
		if e != nil && e.err == nil {
			return e.val, nil
		}
		return APIKey{}, err
	}
	key, _ := v.(APIKey)
	c.mu.Lock()
	if err == nil {
		c.keys[k] = &keyEntry{val: key, gen: c.gen[key.OrgID], fetched: c.now()}
	} else if len(c.keys) < 100_000 {
		c.keys[k] = &keyEntry{err: err, fetched: c.now()}
	}
	c.mu.Unlock()
	return key, err
}

// Listen subscribes to the invalidation channel until ctx ends, and publishes this
// replica's own changes on it. A (re)subscription drops the whole cache, since
// messages may have been missed while disconnected.
func (c *Cache) Listen(ctx context.Context, rdb redis.UniversalClient) {
	c.svc.OnChange(func(orgIDs ...string) {
		pctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for _, id := range orgIDs {
			if err := rdb.Publish(pctx, InvalidationChannel, id).Err(); err != nil {
				c.log.Warn("cannot publish a cache invalidation; other replicas catch up by TTL", "org", id, "err", err.Error())
			}
		}
	})
	ps := rdb.Subscribe(ctx, InvalidationChannel)
	go func() {
		defer ps.Close()
		for {
			msg, err := ps.Receive(ctx)
			if ctx.Err() != nil {
				return
			}
			switch m := msg.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					c.InvalidateAll()
				}
			case *redis.Message:
				c.Invalidate(m.Payload)
			}
			if err != nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
}
