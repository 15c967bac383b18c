package quota

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

var (
	//go:embed scripts/check.lua
	checkSrc string
	//go:embed scripts/hydrate.lua
	hydrateSrc string
	//go:embed scripts/drain.lua
	drainSrc string
	//go:embed scripts/wouldblock.lua
	wouldBlockSrc string

	checkScript          = redis.NewScript(checkSrc)
	checkSHA         any = checkScript.Hash() // boxed once
	hydrateScript        = redis.NewScript(hydrateSrc)
	drainScript          = redis.NewScript(drainSrc)
	wouldBlockScript     = redis.NewScript(wouldBlockSrc)
)

// DefaultKeyCacheSize is the default bound of an engine's key cache: 262,144 entries,
// some 500 bytes each with the LRU's own (130 MB when full). It is above the orgs the
// api's resolved-org cache holds in its default memory budget (~160,000 of 5 teams),
// so checks spread over every cached org find their keys built, rather than evict one
// org's to build another's on every check.
const DefaultKeyCacheSize = 1 << 18

// Config tunes an Engine. The zero value is usable: every field has a default.
type Config struct {
	// KeyPrefix starts every key (default "q"); tests use their own to stay apart.
	// It may not contain '{', '}' or '|'.
	KeyPrefix string
	// MaxBatch caps the checks sent in one pipeline (default 128).
	MaxBatch int
	// MonthRetention keeps month counters, the dirty set and the period marker this
	// long after the period ends, so the worker can persist and close it (default 7 days).
	MonthRetention time.Duration
	// IdempotencyTTL is how long an idempotency key remembers its decision (default 24 h).
	IdempotencyTTL time.Duration
	// IdempotencyRecords bounds the idempotency records one org holds in Redis
	// (default DefaultIdempotencyRecords; -1: no bound); UnregisteredUsers bounds the
	// distinct unregistered users one org names in a billing period (default
	// DefaultUnregisteredUsers; -1: no bound). A check past either is refused with a
	// *BoundError (bounds.go).
	IdempotencyRecords int64
	UnregisteredUsers  int64
	// Hydrator supplies stored usage when an org's counters for a period are missing
	// from Redis; nil means there is none (the period starts from what Redis has).
	Hydrator Hydrator
	// HydrateTimeout bounds one hydration, shared by all checks waiting on it (default 5 s).
	HydrateTimeout time.Duration
	// Clock reads the local clock (nil: time.Now). The engine's Now is its last
	// Redis TIME sample plus the time elapsed since the sample, measured as the
	// difference of two readings of Clock (time.Time.Sub): on Go's monotonic clock when
	// both carry a monotonic reading, as time.Now's do, so a step of the wall clock
	// (NTP, a resumed VM) changes nothing. A test's fake clock moves the engine's time
	// by moving its readings. See clock.go.
	Clock func() time.Time
	// Monotonic, when set, is the clock elapsed time is measured on instead: a reading
	// from any fixed origin that never steps. Clock then only gives wall readings, which
	// no decision uses: a clock source that steps its wall reading alone (StepClock,
	// testenv.Clock.Step) sets both.
	Monotonic func() time.Duration
	// ClockSync is how often Redis TIME is sampled (default 30 s).
	ClockSync time.Duration
	// OnPipeline, when set, is told the size and round-trip time of every pipeline the
	// engine sends (metrics). It runs on the sending goroutine and must not block.
	OnPipeline func(size int, rtt time.Duration)
	// RetryBudget bounds how long, on a Redis Cluster, a check that Redis refused
	// without running it (a redirect, a failover in progress) is sent again before it
	// fails with ErrUnavailable (default 300 ms). See cluster.go.
	RetryBudget time.Duration
	// OnResend, when set, is told the reason (the Redis error's first word, or "dial")
	// of every such re-send (metrics). It must not block.
	OnResend func(reason string)
	// KeyCacheSize bounds the engine's cache of each org's keys for a period (its
	// EVALSHA arguments, built once), least recently used evicted first (default
	// DefaultKeyCacheSize).
	KeyCacheSize int
	// KeyCache is told of the key cache's hits, misses and evictions (metrics).
	KeyCache cachemetrics.Hooks
	// WouldBlockCap bounds the distinct rows (metric, level, id, window) of an org's
	// would-block record in a period, in Redis and pending in this process; what
	// would have been blocked beyond it is counted in the row LevelOther, so totals
	// stay exact (default 1,000; wouldblock.go).
	WouldBlockCap int
	// WouldBlockFlush is how often the would-block counts gathered in process are
	// added to Redis (default 1 s).
	WouldBlockFlush time.Duration
	// TracerProvider, when set, traces checks (trace.go): a span per Engines check and
	// per pipeline sent, linked to the checks it carries. Nil (the default) starts no
	// span and costs a check nothing.
	TracerProvider trace.TracerProvider
	// OnReservation, when set, is told of every reservation this engine opens or
	// settles (metrics). It must not block.
	OnReservation func(ReservationEvent)
	// Leases turns leases on (lease.go); the zero value is off.
	Leases LeaseConfig

	// bucketsOnEngineClock decides token buckets on the engine's now instead of the
	// Redis TIME of the script (check.lua's "Token buckets"): for simulations at chosen
	// times (CheckCommand) and tests of a fake clock only; never set in a server.
	bucketsOnEngineClock bool
}

func (c *Config) setDefaults() error {
	if c.KeyPrefix == "" {
		c.KeyPrefix = "q"
	}
	for _, r := range c.KeyPrefix {
		if r == '{' || r == '}' || r == '|' {
			return fmt.Errorf("%w: key prefix %q may not contain '{', '}' or '|'", ErrInvalid, c.KeyPrefix)
		}
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 128
	}
	if c.MonthRetention <= 0 {
		c.MonthRetention = 7 * 24 * time.Hour
	}
	if c.IdempotencyTTL <= 0 {
		c.IdempotencyTTL = 24 * time.Hour
	}
	if c.IdempotencyRecords == 0 {
		c.IdempotencyRecords = DefaultIdempotencyRecords
	}
	if c.UnregisteredUsers == 0 {
		c.UnregisteredUsers = DefaultUnregisteredUsers
	}
	if c.HydrateTimeout <= 0 {
		c.HydrateTimeout = 5 * time.Second
	}
	if c.ClockSync <= 0 {
		c.ClockSync = 30 * time.Second
	}
	if c.RetryBudget <= 0 {
		c.RetryBudget = 300 * time.Millisecond
	}
	if c.KeyCacheSize <= 0 {
		c.KeyCacheSize = DefaultKeyCacheSize
	}
	if c.WouldBlockCap <= 0 {
		c.WouldBlockCap = 1000
	}
	if c.WouldBlockFlush <= 0 {
		c.WouldBlockFlush = time.Second
	}
	return nil
}

// Engine decides checks against one Redis (a pool class or an org's dedicated
// Redis). It is safe for concurrent use; Close stops it.
type Engine struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // rdb on a Redis Cluster, else nil
	slotted bool                 // the dirty-org index is one set per cluster slot (dirtyorgs.go)
	cfg     Config
	idemTTL int64 // seconds

	clock atomic.Pointer[clockSample] // the last Redis TIME sample kept; nil until one is

	queue     chan *call
	closing   chan struct{} // closed by Close
	stopped   chan struct{} // closed when the batching loop has exited
	wg        sync.WaitGroup
	closeOnce sync.Once

	flight  singleflight.Group
	calls   sync.Pool
	keys    *keyCache                        // an org's keys for a period, built and boxed once
	periods [29]atomic.Pointer[vocab.Period] // the current period by anchor day (0 = 1)
	ttlArg  any                              // idemTTL, boxed once
	wb      *wouldBlocks                     // would-block counts not yet in Redis
	tracer  trace.Tracer                     // nil when tracing is off

	// bounds and boundsUser are check.lua's bounds argument (bounds.go), boxed once:
	// boundsUser for a request naming an unregistered user
	bounds, boundsUser any

	reserving sync.Map // org -> the lost count when this engine added it to the reserving set (reserve.go)
	// lost counts the signs that Redis lost data since New (a NOSCRIPT reply: Redis
	// restarted or failed over; a hydration: an org's keys were missing), so the
	// reserving set is written again after a loss (markReserving).
	lost   atomic.Uint64
	leases *leases // nil when leases are off
}

// ClientOptions parses a redis:// URL into options fit for an Engine: retries off.
func ClientOptions(url string) (*redis.Options, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("%w: redis url: %w", ErrInvalid, err)
	}
	opt.MaxRetries = -1
	return opt, nil
}

// New starts an engine on rdb, which must not retry commands: a *redis.Client made
// with MaxRetries: -1 (see ClientOptions), or a *redis.ClusterClient with MaxRetries
// and MaxRedirects -1. Otherwise it returns ErrRetryingClient: go-redis re-sends a
// command whose reply was lost, and a re-sent check is counted again (a check behind
// one lost reply was measured counted four times with the default of 3 retries).
// The engine does not own rdb; close it after Close.
//
// New samples Redis TIME once; if Redis is down it starts anyway and keeps trying
// in the background (until then Now is the local clock).
func New(rdb redis.UniversalClient, cfg Config) (*Engine, error) {
	switch c := rdb.(type) {
	case *redis.Client:
		if c.Options().MaxRetries != 0 { // -1 has been normalised to 0 by NewClient
			return nil, ErrRetryingClient
		}
	case *redis.ClusterClient:
		if o := c.Options(); o.MaxRetries > 0 || o.MaxRedirects != 0 {
			return nil, ErrRetryingClient
		}
	default:
		return nil, fmt.Errorf("%w: unsupported redis client %T", ErrInvalid, rdb)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	e := &Engine{
		rdb:     rdb,
		cfg:     cfg,
		idemTTL: int64(cfg.IdempotencyTTL / time.Second),
		queue:   make(chan *call, 4*cfg.MaxBatch),
		closing: make(chan struct{}),
		stopped: make(chan struct{}),
		keys:    newKeyCache(cfg.KeyCacheSize, cfg.KeyCache),
		wb:      newWouldBlocks(cfg.WouldBlockCap),
	}
	e.ttlArg = e.idemTTL
	e.bounds, e.boundsUser = boundsArgs(&e.cfg)
	e.tracer = newTracer(cfg.TracerProvider)
	e.cluster, _ = rdb.(*redis.ClusterClient)
	e.slotted = e.cluster != nil
	e.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = e.syncClock(ctx) // failure is retried by clockLoop
	cancel()
	if cfg.Leases.Enabled {
		e.leases = newLeases(e, cfg.Leases)
		e.wg.Add(1)
		go e.leases.janitor()
	}
	e.wg.Add(2)
	go e.clockLoop()
	go e.wouldBlockLoop()
	go e.loop()
	return e, nil
}

// Close settles the engine's open leases (once each: a failure leaves them to the
// reservation sweep), then stops the batching loop and the clock sampler. Checks queued
// but not yet sent fail with ErrClosed; a pipeline in flight completes first. The
// would-block counts gathered so far are flushed to Redis (within 2 s).
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		if e.leases != nil {
			e.leases.settleAll()
		}
		close(e.closing)
	})
	<-e.stopped
	e.wg.Wait()
	return nil
}

// Period is the billing period at Now for an org with the given anchor day.
func (e *Engine) Period(anchorDay int) vocab.Period { return vocab.PeriodAt(e.Now(), anchorDay) }

func (e *Engine) clockLoop() {
	defer e.wg.Done()
	for {
		wait := e.cfg.ClockSync
		if e.clock.Load() == nil {
			wait = min(wait, time.Second)
		}
		t := time.NewTimer(wait)
		select {
		case <-e.closing:
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.syncClock(ctx)
		cancel()
	}
}
