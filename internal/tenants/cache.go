package tenants

import (
	"context"
	"crypto/sha256"
	"errors"
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
)

// InvalidationChannel is the Redis pub/sub channel on which replicas announce the
// orgs they changed: the channel of the default key prefix (ChannelFor).
const InvalidationChannel = "quotaplane:invalidate"

// ChannelFor is the invalidation channel of an install whose Redis keys start with
// prefix (QUOTA_REDIS_PREFIX): InvalidationChannel for the default "q" (or ""), else
// "quotaplane:<prefix>:invalidate", so installs sharing a Redis do not hear each
// other's changes.
func ChannelFor(prefix string) string {
	if prefix == "" || prefix == "q" {
		return InvalidationChannel
	}
	return "quotaplane:" + prefix + ":invalidate"
}

// Default bounds of a Cache (docs/ARCHITECTURE.md, "The resolved-limits cache", says
// why these).
//
// Tenants number in the tens of thousands, and an org checked less often than a TTL
// would pay Postgres lookups, so the bounds are derived from a memory budget
// (DefaultCacheMemory) rather than a count, and the TTLs are a safety net in minutes:
// pub/sub invalidation keeps entries fresh.
const (
	DefaultCacheOrgs   = 1_000_000 // resolved orgs (the memory budget binds first)
	DefaultCacheUsers  = 200_000   // registered users carried by cached orgs, summed
	DefaultCacheKeys   = 500_000   // API keys: ~400 bytes each, 200 MB at most
	DefaultCacheMemory = 512 << 20 // bytes of resolved orgs, estimated (orgBytes): ~160,000 orgs of 5 teams
	DefaultCacheTTL    = 5 * time.Minute
	DefaultCacheKeyTTL = 2 * time.Minute
	// DefaultCacheNegative bounds the unknown org ids and the bad tokens remembered,
	// each apart (~100 bytes an entry).
	DefaultCacheNegative = 100_000
)

// Cache keeps resolved orgs, users and API keys in memory, so a check in steady state
// costs no Postgres query. An org is resolved with its registered users (up to a
// tenth of the Users bound), so an unregistered user id, which needs no registration,
// is known as such without a query; the user ids of an org above that are looked up
// one by one through a bounded cache of their own, unregistered ids included.
//
// Every part is an LRU bounded in entries (hashicorp/golang-lru): orgs (and the
// registered users they carry, summed), users of the large orgs, API keys, and bad
// tokens apart from the keys, so a flood of made-up tokens cannot push real keys out.
//
// Entries are dropped when their org changes: at once in the replica that made the
// change (through Service.OnChange), and within a moment in every other replica
// through Redis pub/sub (Listen). Each entry carries its org's generation when it was
// read, and an invalidation bumps the generation, so an entry read before a change is
// never served after it, however the read and the invalidation interleave. A TTL
// bounds staleness should a message be lost; API keys live at most KeyTTL, so a
// revoked key stops working within that time everywhere. Entries past their TTL stay
// until the LRU evicts them: when Postgres cannot be reached, they keep serving.
type Cache struct {
	svc      *Service
	channel  string // of invalidations, on Redis pub/sub
	ttl      time.Duration
	keyTTL   time.Duration
	log      *slog.Logger
	now      func() time.Time
	maxUsers int // registered users an org may carry (a tenth of the Users bound)

	// gens holds the generation of every org, hashed into fixed slots: bounded, and a
	// collision only costs another org a re-read.
	gens  [genSlots]atomic.Uint64
	seed  maphash.Seed
	epoch atomic.Uint64 // bumped by every invalidation, of any org

	addMu     sync.Mutex // orders the org additions, which keep orgUsers and orgMem exact
	orgs      *lru.Cache[string, *orgEntry]
	orgUsers  atomic.Int64 // registered users carried by the cached orgs
	userBound int64
	orgMem    atomic.Int64 // estimated bytes of the cached orgs (orgBytes)
	memBound  int64
	noOrgs    *lru.Cache[string, uint64]        // unknown org ids, with the org's generation then
	users     *lru.Cache[[2]string, *userEntry] // users of orgs above maxUsers
	keys      *lru.Cache[[32]byte, *keyEntry]
	badTokens *lru.Cache[[32]byte, badToken]
	sf        singleflight.Group
	userBatch userBatches

	caps capacityCache // every capacity (cache_capacities.go)

	refreshing atomic.Bool // RefreshKeys runs: keys past half their TTL are queued
	refreshMu  sync.Mutex
	refreshQ   []keyRefresh

	mOrgs, mUsers, mKeys, mBad cachemetrics.Hooks
}

const genSlots = 4096

type orgEntry struct {
	val     ResolvedOrg
	gen     uint64
	fetched time.Time
	bytes   int64 // orgBytes(val)
}

// badToken is a negative entry of the key cache: when the token was found bad, and
// the epoch then. Any invalidation (a key or an org created, among others) moves the
// epoch, and the entry is no longer served.
type badToken struct {
	at    time.Time
	epoch uint64
}

// orgBytes estimates the heap a resolved org holds: a fixed part for the structs and
// maps, and the strings and limits of its teams, users, metrics and throttles. It
// errs high (map buckets are counted as full), so the budget is an upper bound.
func orgBytes(r ResolvedOrg) int64 {
	const base, perTeam, perUser, perLimit, perThrottle = 1024, 400, 160, 64, 200
	n := int64(base) + int64(len(r.Org.ID)+len(r.Org.Name)+len(r.Org.PlanID)+len(r.Org.WebhookURL)+len(r.Org.RedisURL)) +
		perLimit*int64(len(r.Org.Limits)+len(r.Org.EffectiveLimits)+len(r.Org.Granted))
	for id, t := range r.Teams {
		n += perTeam + int64(2*len(id)+len(t.Name)) + perLimit*int64(len(t.Limits)+len(t.UserLimits))
	}
	for id, u := range r.Users {
		n += perUser + int64(len(id)+len(u.TeamID)) + perLimit*int64(len(u.Limits))
	}
	n += perThrottle * int64(len(r.Throttles))
	n += 64 * int64(len(r.Metrics.sorted))
	return n
}

// lapsed reports whether a grant the entry counts has lapsed by now (on the
// service's clock, which resolution compares grants with): its limits are then too
// high, and the org is read again however fresh the entry.
func (e *orgEntry) lapsed(now time.Time) bool {
	l := e.val.Org.GrantsLapse
	return !l.IsZero() && !now.Before(l)
}

type userEntry struct {
	val     ResolvedUser
	gen     uint64
	fetched time.Time
}

type keyEntry struct {
	val     APIKey
	gen     uint64
	fetched time.Time
	queued  atomic.Bool // handed to RefreshKeys, which replaces the entry when the key is live
}

// keyRefresh is a key entry to revalidate, under its token's digest.
type keyRefresh struct {
	k [32]byte
	e *keyEntry
}

// Bounds of the key refresh: the keys revalidated in one query, and the keys waiting.
// A key that finds the queue full is looked up alone when its TTL ends, as without a
// refresher.
const (
	maxKeyRefreshBatch = 5000
	maxKeyRefreshQueue = 1 << 16
)

// CacheOptions tunes a Cache.
type CacheOptions struct {
	TTL    time.Duration // default DefaultCacheTTL (5 min)
	KeyTTL time.Duration // default DefaultCacheKeyTTL (2 min)
	// Orgs bounds the resolved orgs kept (default DefaultCacheOrgs); Memory bounds
	// their estimated bytes (default DefaultCacheMemory): the least recently used go
	// until both hold.
	Orgs   int
	Memory int64
	// Negative bounds the unknown org ids, and apart the bad tokens, remembered
	// (default DefaultCacheNegative).
	Negative int
	// Users bounds the registered users the cached orgs carry, summed (default
	// DefaultCacheUsers). An org with more than a tenth of it is resolved without its
	// users, so at least ten such orgs fit at once; their user ids go through a
	// per-user cache of Users entries.
	Users int
	// Keys bounds the API keys kept, and apart the bad tokens (default DefaultCacheKeys).
	Keys    int
	Logger  *slog.Logger
	Metrics *cachemetrics.Metrics // counts by cache: orgs, users, keys, bad_tokens; nil: none
	// Channel is the Redis pub/sub channel of invalidations (default
	// InvalidationChannel): replicas that share a Redis and a database must share it.
	Channel string
	// CapacityTTL is how old the capacities may grow before they are read again in
	// the background (default DefaultCapacityTTL); a change reaches them at once.
	CapacityTTL time.Duration
}

func newLRU[K comparable, V any](size int) *lru.Cache[K, V] {
	c, err := lru.New[K, V](size)
	if err != nil {
		panic(err) // only for a size <= 0, which NewCache rules out
	}
	return c
}

// NewCache returns a cache over svc and subscribes it to svc's changes.
func NewCache(svc *Service, o CacheOptions) *Cache {
	if o.TTL <= 0 {
		o.TTL = DefaultCacheTTL
	}
	if o.KeyTTL <= 0 {
		o.KeyTTL = DefaultCacheKeyTTL
	}
	if o.Orgs <= 0 {
		o.Orgs = DefaultCacheOrgs
	}
	if o.Memory <= 0 {
		o.Memory = DefaultCacheMemory
	}
	if o.Negative <= 0 {
		o.Negative = DefaultCacheNegative
	}
	if o.Users <= 0 {
		o.Users = DefaultCacheUsers
	}
	if o.Keys <= 0 {
		o.Keys = DefaultCacheKeys
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Channel == "" {
		o.Channel = InvalidationChannel
	}
	c := &Cache{svc: svc, channel: o.Channel, ttl: o.TTL, keyTTL: o.KeyTTL, log: o.Logger, now: time.Now, seed: maphash.MakeSeed(),
		maxUsers: max(o.Users/10, 1), userBound: int64(o.Users),
		users: newLRU[[2]string, *userEntry](o.Users), keys: newLRU[[32]byte, *keyEntry](o.Keys),
		badTokens: newLRU[[32]byte, badToken](o.Negative), noOrgs: newLRU[string, uint64](o.Negative), memBound: o.Memory,
		mOrgs: o.Metrics.For("orgs"), mUsers: o.Metrics.For("users"), mKeys: o.Metrics.For("keys"),
		mBad: o.Metrics.For("bad_tokens")}
	orgs, err := lru.NewWithEvict(o.Orgs, func(_ string, e *orgEntry) {
		c.orgUsers.Add(-int64(len(e.val.Users)))
		c.orgMem.Add(-e.bytes)
	})
	if err != nil {
		panic(err)
	}
	c.orgs = orgs
	c.caps.ttl = o.CapacityTTL
	if c.caps.ttl <= 0 {
		c.caps.ttl = DefaultCapacityTTL
	}
	svc.OnChange(c.localChange)
	c.refreshCapacities() // so that the first check finds them read
	return c
}

func (c *Cache) gen(orgID string) *atomic.Uint64 {
	return &c.gens[maphash.String(c.seed, orgID)%genSlots]
}

// Invalidate drops every entry of the orgs named. The org's users and keys are not
// searched for: their generation no longer matches, so they are never served again,
// and the LRU reclaims them.
func (c *Cache) Invalidate(orgIDs ...string) {
	for _, id := range orgIDs {
		if id == capacitiesTopic {
			c.capacitiesChanged(false)
			continue
		}
		c.gen(id).Add(1)
		c.epoch.Add(1)
		c.orgs.Remove(id)
	}
}

// localChange is Invalidate for a change this replica made: the capacities are read
// again before the change's answer.
func (c *Cache) localChange(orgIDs ...string) {
	for i, id := range orgIDs {
		if id == capacitiesTopic {
			c.capacitiesChanged(true)
			c.Invalidate(append(orgIDs[:i:i], orgIDs[i+1:]...)...)
			return
		}
	}
	c.Invalidate(orgIDs...)
}

// InvalidateAll drops everything, e.g. after the pub/sub connection was lost.
func (c *Cache) InvalidateAll() {
	for i := range c.gens {
		c.gens[i].Add(1)
	}
	c.epoch.Add(1)
	c.capacitiesChanged(false)
	c.orgs.Purge()
	c.users.Purge()
	c.keys.Purge()
	c.badTokens.Purge()
	c.noOrgs.Purge()
}

// isDown reports whether err means Postgres could not answer (as opposed to "no such
// thing"), in which case a stale entry is better than no answer.
func isDown(err error) bool {
	return err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrBadToken) && !errors.Is(err, context.Canceled)
}

// Org returns the resolved org, with its registered users unless it has too many.
func (c *Cache) Org(ctx context.Context, orgID string) (ResolvedOrg, error) {
	g := c.gen(orgID)
	gen := g.Load()
	e, ok := c.orgs.Get(orgID)
	if ok && e.gen != gen {
		e = nil // read before a change of the org: never served again, not even stale
	}
	if e != nil && c.now().Sub(e.fetched) < c.ttl && !e.lapsed(c.svc.now()) {
		c.mOrgs.Hit()
		return e.val, nil
	}
	if e == nil {
		// Unknown before: unknown until the org is created, which moves its generation.
		if ng, ok := c.noOrgs.Get(orgID); ok && ng == gen {
			c.mOrgs.Hit()
			return ResolvedOrg{}, derrors.Wrap(ErrNotFound, "org %q", orgID)
		}
	}
	c.mOrgs.Miss()
	// The generation is read inside the flight, before its queries, and stored with
	// what they read. A caller that joined a flight started before the latest change
	// it could know of reads again on its own.
	fetch := func() (any, error) {
		e := &orgEntry{gen: g.Load()}
		var err error
		if e.val, err = c.svc.ResolveOrgUsers(ctx, orgID, c.maxUsers); err != nil {
			if errors.Is(err, ErrNotFound) {
				c.noOrgs.Add(orgID, e.gen)
			}
			return nil, err
		}
		e.bytes = orgBytes(e.val)
		e.fetched = c.now()
		c.addOrg(orgID, e)
		return e, nil
	}
	v, err, _ := c.sf.Do("o\x00"+orgID, fetch)
	if err == nil && v.(*orgEntry).gen < gen {
		v, err = fetch()
	}
	if err != nil {
		if e != nil && isDown(err) {
			c.log.Warn("serving a stale org: Postgres unavailable", "org", orgID, "err", err.Error())
			return e.val, nil
		}
		return ResolvedOrg{}, err
	}
	return v.(*orgEntry).val, nil
}

// addOrg stores an org and keeps the registered users carried by the cached orgs
// within their bound: the least recently used orgs go until they fit (the one just
// added goes last, and fits alone, carrying at most a tenth of the bound).
func (c *Cache) addOrg(orgID string, e *orgEntry) {
	c.addMu.Lock()
	defer c.addMu.Unlock()
	c.orgs.Remove(orgID) // so its users are subtracted: Add replaces without a callback
	c.noOrgs.Remove(orgID)
	c.orgUsers.Add(int64(len(e.val.Users)))
	c.orgMem.Add(e.bytes)
	if c.orgs.Add(orgID, e) {
		c.mOrgs.Evict()
	}
	for c.orgUsers.Load() > c.userBound || c.orgMem.Load() > c.memBound && c.orgs.Len() > 1 {
		if _, _, ok := c.orgs.RemoveOldest(); !ok {
			break
		}
		c.mOrgs.Evict()
	}
}

// User returns what is known of a user id of a resolved org: from the org itself when
// it carries its users (no lookup at all), else through the per-user cache.
func (c *Cache) User(ctx context.Context, org ResolvedOrg, userID string) (ResolvedUser, error) {
	if u, ok := org.User(userID); ok {
		return u, nil
	}
	orgID := org.Org.ID
	k := [2]string{orgID, userID}
	gen := c.gen(orgID).Load()
	e, ok := c.users.Get(k)
	if ok && e.gen != gen {
		e = nil
	}
	if e != nil && c.now().Sub(e.fetched) < c.ttl {
		c.mUsers.Hit()
		return e.val, nil
	}
	c.mUsers.Miss()
	got, err := c.userBatch.lookup(ctx, c, orgID, userID)
	if err == nil && got.gen < gen {
		// joined a lookup older than a change this caller may know of: read again alone
		got = &userEntry{gen: c.gen(orgID).Load()}
		if got.val, err = c.svc.ResolveUser(ctx, orgID, userID); err == nil {
			got.fetched = c.now()
			c.addUser(k, got)
		}
	}
	if err != nil {
		if e != nil && isDown(err) {
			return e.val, nil
		}
		return ResolvedUser{}, err
	}
	return got.val, nil
}

func (c *Cache) addUser(k [2]string, e *userEntry) {
	if c.users.Add(k, e) {
		c.mUsers.Evict()
	}
}

// maxUserBatch bounds the user ids of one lookup query.
const maxUserBatch = 500

// userBatches batches the lookups of the user ids of large orgs: the ids of an org
// missed while a lookup of that org is in flight wait for it to end and go together in
// the next query (up to maxUserBatch), so a burst of new ids costs a few queries, not
// one each, and a lone miss waits for nothing. An id already pending joins its lookup.
type userBatches struct {
	mu   sync.Mutex
	orgs map[string]*userBatch
}

type userBatch struct {
	pending map[string]*userCall
}

type userCall struct {
	done chan struct{}
	e    *userEntry
	err  error
}

func (b *userBatches) lookup(ctx context.Context, c *Cache, orgID, userID string) (*userEntry, error) {
	b.mu.Lock()
	if b.orgs == nil {
		b.orgs = map[string]*userBatch{}
	}
	ob, running := b.orgs[orgID]
	if !running {
		ob = &userBatch{pending: map[string]*userCall{}}
		b.orgs[orgID] = ob
	}
	call := ob.pending[userID]
	if call == nil {
		call = &userCall{done: make(chan struct{})}
		ob.pending[userID] = call
	}
	b.mu.Unlock()
	if running {
		select {
		case <-call.done:
			return call.e, call.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// This caller leads the org's lookups until its own is answered.
	b.lead(context.WithoutCancel(ctx), c, orgID, ob, call)
	return call.e, call.err
}

// userLookupTimeout bounds one batched lookup, which no single caller's context ends.
const userLookupTimeout = 5 * time.Second

// lead runs the org's lookups, a batch at a time, until none is pending or (when own
// is not nil) own was answered: the rest go on in a goroutine of their own, so no
// caller waits for more than its own batch and the one in flight before it.
func (b *userBatches) lead(ctx context.Context, c *Cache, orgID string, ob *userBatch, own *userCall) {
	for {
		b.mu.Lock()
		if len(ob.pending) == 0 {
			delete(b.orgs, orgID)
			b.mu.Unlock()
			return
		}
		if own != nil && own.e != nil || own != nil && own.err != nil {
			b.mu.Unlock()
			go b.lead(ctx, c, orgID, ob, nil)
			return
		}
		calls := make(map[string]*userCall, min(len(ob.pending), maxUserBatch))
		for id, cl := range ob.pending {
			if len(calls) == maxUserBatch {
				break
			}
			calls[id] = cl
			delete(ob.pending, id)
		}
		b.mu.Unlock()
		ids := make([]string, 0, len(calls))
		for id := range calls {
			ids = append(ids, id)
		}
		gen := c.gen(orgID).Load() // before the query, as for an org
		qctx, cancel := context.WithTimeout(ctx, userLookupTimeout)
		users, err := c.svc.ResolveUsers(qctx, orgID, ids)
		cancel()
		fetched := c.now()
		for id, cl := range calls {
			if err != nil {
				cl.err = err
			} else {
				cl.e = &userEntry{val: users[id], gen: gen, fetched: fetched}
				c.addUser([2]string{orgID, id}, cl.e)
			}
			close(cl.done)
		}
	}
}

// Authenticate is Service.Authenticate through the cache: a token is looked up in
// Postgres at most once per KeyTTL. Bad tokens are remembered as briefly, so a
// burst of them does not reach Postgres each time.
func (c *Cache) Authenticate(ctx context.Context, token string) (APIKey, error) {
	return c.AuthenticateHashed(ctx, token, TokenSum(token))
}

// TokenSum is the SHA-256 of token, without allocating for tokens of up to 128
// bytes: sha256.Sum256([]byte(token)) would copy the token to the heap on every check
// (BenchmarkServerCheck).
func TokenSum(token string) [32]byte {
	if len(token) > len(tokenBuf{}) {
		return sha256.Sum256([]byte(token))
	}
	b := tokenBufs.Get().(*tokenBuf)
	sum := sha256.Sum256(append(b[:0], token...))
	tokenBufs.Put(b)
	return sum
}

type tokenBuf [128]byte

var tokenBufs = sync.Pool{New: func() any { return new(tokenBuf) }}

// AuthenticateHashed is Authenticate for a caller that already has the token's
// SHA-256 (the HTTP layer computes it once per request for the operator check).
func (c *Cache) AuthenticateHashed(ctx context.Context, token string, k [32]byte) (APIKey, error) {
	if !LooksLikeAPIKey(token) {
		return APIKey{}, ErrBadToken
	}
	e, ok := c.keys.Get(k)
	if ok && e.gen != c.gen(e.val.OrgID).Load() {
		e = nil
	}
	if e != nil {
		if age := c.now().Sub(e.fetched); age < c.keyTTL {
			c.mKeys.Hit()
			if age >= c.keyTTL/2 && c.refreshing.Load() && e.queued.CompareAndSwap(false, true) {
				c.queueRefresh(k, e)
			}
			return e.val, nil
		}
	}
	if e == nil {
		if b, ok := c.badTokens.Get(k); ok && c.now().Sub(b.at) < c.keyTTL && b.epoch == c.epoch.Load() {
			c.mBad.Hit()
			return APIKey{}, ErrBadToken
		}
	}
	c.mKeys.Miss()
	type result struct {
		key   APIKey
		epoch uint64
	}
	epoch := c.epoch.Load()
	fetch := func() (any, error) {
		// The key's org is known only after the lookup: an invalidation of any org
		// during it (the epoch moved) leaves the key uncached, so it cannot outlive
		// a change of its own org that it did not see.
		r := result{epoch: c.epoch.Load()}
		key, err := c.svc.Authenticate(ctx, token)
		switch {
		case errors.Is(err, ErrBadToken):
			c.keys.Remove(k)
			if c.badTokens.Add(k, badToken{at: c.now(), epoch: r.epoch}) {
				c.mBad.Evict()
			}
		case err == nil:
			gen := c.gen(key.OrgID).Load()
			if c.epoch.Load() == r.epoch && c.keys.Add(k, &keyEntry{val: key, gen: gen, fetched: c.now()}) {
				c.mKeys.Evict()
			}
		}
		r.key = key
		return r, err
	}
	v, err, _ := c.sf.Do("k\x00"+string(k[:]), fetch)
	if r, ok := v.(result); ok && r.epoch < epoch {
		v, err = fetch() // joined a lookup older than a change this caller may know of
	}
	if isDown(err) {
		if e != nil {
			return e.val, nil
		}
		return APIKey{}, err
	}
	r, _ := v.(result)
	return r.key, err
}

// RefreshKeys revalidates, every interval until ctx ends, the cached keys used past
// half their TTL, up to maxKeyRefreshBatch in one query (Service.LiveKeys): a live key
// is served for another TTL from the time of the query, a revoked or deleted one is
// dropped. Keys in use are then never looked up one by one on the check path, and
// keeping N keys fresh costs N/5,000 queries per half TTL rather than N lookups per
// TTL, while a revoked key still stops working within the TTL.
func (c *Cache) RefreshKeys(ctx context.Context, interval time.Duration) {
	c.refreshing.Store(true)
	defer c.refreshing.Store(false)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.refreshKeys(ctx)
		}
	}
}

func (c *Cache) queueRefresh(k [32]byte, e *keyEntry) {
	c.refreshMu.Lock()
	defer c.refreshMu.Unlock()
	if len(c.refreshQ) >= maxKeyRefreshQueue {
		e.queued.Store(false)
		return
	}
	c.refreshQ = append(c.refreshQ, keyRefresh{k, e})
}

// refreshKeys revalidates the keys queued so far, a batch per query.
func (c *Cache) refreshKeys(ctx context.Context) {
	c.refreshMu.Lock()
	q := c.refreshQ
	c.refreshQ = nil
	c.refreshMu.Unlock()
	for len(q) > 0 {
		batch := q[:min(len(q), maxKeyRefreshBatch)]
		q = q[len(batch):]
		ids, gens := make([]string, len(batch)), make([]uint64, len(batch))
		for i, r := range batch {
			ids[i], gens[i] = r.e.val.ID, c.gen(r.e.val.OrgID).Load() // before the query, as for a lookup
		}
		at := c.now()
		live, err := c.svc.LiveKeys(ctx, ids)
		for i, r := range batch {
			cur, ok := c.keys.Peek(r.k)
			switch {
			case !ok || cur != r.e: // replaced or evicted meanwhile
			case err != nil:
				r.e.queued.Store(false) // looked up alone at the end of its TTL
			case !live[ids[i]]:
				c.keys.Remove(r.k)
			case r.e.gen == gens[i] && c.gen(r.e.val.OrgID).Load() == gens[i]:
				c.keys.Add(r.k, &keyEntry{val: r.e.val, gen: r.e.gen, fetched: at})
			}
		}
	}
}

// Listen subscribes to the invalidation channel until ctx ends, and publishes this
// replica's own changes on it. A (re)subscription drops the whole cache, since
// messages may have been missed while disconnected.
func (c *Cache) Listen(ctx context.Context, rdb redis.UniversalClient) {
	c.svc.OnChange(func(orgIDs ...string) {
		pctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		for _, id := range orgIDs {
			if err := rdb.Publish(pctx, c.channel, id).Err(); err != nil {
				c.log.Warn("cannot publish a cache invalidation; other replicas catch up by TTL", "org", id, "err", err.Error())
			}
		}
	})
	subscribe(ctx, rdb, c.channel, func(org string) { c.Invalidate(org) }, c.InvalidateAll)
}

// Subscribe calls changed with each org id announced on channel (the invalidation
// channel, ChannelFor) until ctx ends, and all on every (re)subscription, since
// messages may have been missed while disconnected. It returns at once; the
// subscription runs in its own goroutine.
func Subscribe(ctx context.Context, rdb redis.UniversalClient, channel string, changed func(org string), all func()) {
	subscribe(ctx, rdb, channel, func(org string) {
		if org != capacitiesTopic { // a change of the capacities, which names no org
			changed(org)
		}
	}, all)
}

// subscribe is Subscribe telling every announcement, capacitiesTopic too.
func subscribe(ctx context.Context, rdb redis.UniversalClient, channel string, changed func(string), all func()) {
	ps := rdb.Subscribe(ctx, channel)
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
					all()
				}
			case *redis.Message:
				changed(m.Payload)
			}
			if err != nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
}
