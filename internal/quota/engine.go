// Package quota is Quotaplane's enforcement engine: it decides checks against the
// limits of an org, its team and its user, exactly and atomically, in Redis.
//
// One check is one run of scripts/check.lua: it reads every limited counter of every
// present level, admits the check only if used + cost <= limit everywhere, and only
// then counts the cost at every level (even where a level has no limit, so usage
// reports are complete). Sliding windows (second, minute, hour, day) use the
// two-bucket weighted counter on Redis's own clock; the month window is a fixed
// counter per billing period, whose id is computed here from a clock corrected by
// the offset to Redis TIME, so replicas with skewed clocks decide identically.
//
// Concurrent checks are coalesced into pipelines by one batching goroutine per
// Engine. The engine never re-sends a check script (a check behind a lost reply
// would be counted twice), so it only accepts Redis clients with retries disabled.
//
// The package knows nothing of HTTP or of how limits are stored: callers resolve
// the limits of a check into a Request. KEYS.md describes the Redis key layout and
// the hooks for the durability worker (DrainDirty, Hydrator).
package quota

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

var (
	//go:embed scripts/check.lua
	checkSrc string
	//go:embed scripts/hydrate.lua
	hydrateSrc string
	//go:embed scripts/drain.lua
	drainSrc string

	checkScript       = redis.NewScript(checkSrc)
	checkSHA      any = checkScript.Hash() // boxed once
	hydrateScript     = redis.NewScript(hydrateSrc)
	drainScript       = redis.NewScript(drainSrc)
)

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
	// Hydrator supplies stored usage when an org's counters for a period are missing
	// from Redis; nil means there is none (the period starts from what Redis has).
	Hydrator Hydrator
	// HydrateTimeout bounds one hydration, shared by all checks waiting on it (default 5 s).
	HydrateTimeout time.Duration
	// Clock is the local clock (default time.Now); the engine corrects it by its offset
	// to Redis TIME.
	Clock func() time.Time
	// ClockSync is how often the offset to Redis TIME is sampled (default 30 s).
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
	if c.HydrateTimeout <= 0 {
		c.HydrateTimeout = 5 * time.Second
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.ClockSync <= 0 {
		c.ClockSync = 30 * time.Second
	}
	if c.RetryBudget <= 0 {
		c.RetryBudget = 300 * time.Millisecond
	}
	return nil
}

// Engine decides checks against one Redis (a pool class or an org's dedicated
// Redis). It is safe for concurrent use; Close stops it.
type Engine struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // rdb on a Redis Cluster, else nil
	cfg     Config
	idemTTL int64 // seconds

	offset atomic.Int64 // Redis TIME minus Clock, in nanoseconds
	synced atomic.Bool

	queue     chan *call
	closing   chan struct{} // closed by Close
	stopped   chan struct{} // closed when the batching loop has exited
	wg        sync.WaitGroup
	closeOnce sync.Once

	flight  singleflight.Group
	calls   sync.Pool
	keys    [64]keyShard               // an org's keys for a period, built and boxed once
	periods [29]atomic.Pointer[Period] // the current period by anchor day (0 = 1)
	ttlArg  any                        // idemTTL, boxed once
}

// orgKeys are the EVALSHA arguments every check of one org in one period shares,
// already converted to interface values: building and boxing them per check was a
// third of the engine's allocations.
type orgKeys struct {
	tag          string
	month, dirty any
	expire       int64 // unix s, when the month keys expire
	endMs        int64 // the period's end
	// the current and previous bucket keys of each sliding window, renamed when a
	// bucket ends (by position in slidingWindows)
	buckets [len(slidingWindows)]atomic.Pointer[bucketKeys]
	// the org's counter field of the metric last checked
	orgField atomic.Pointer[metricField]
}

type metricField struct {
	metric string
	field  any
}

// field returns the org's counter field of metric, boxed once.
func (k *orgKeys) field(metric string) any {
	if f := k.orgField.Load(); f != nil && f.metric == metric {
		return f.field
	}
	f := &metricField{metric: metric, field: metric + "|o"}
	k.orgField.Store(f)
	return f.field
}

// bucketKeys names the current and previous bucket of one sliding window.
type bucketKeys struct {
	n, ms     int64 // bucket number (unix ms / ms), window length in ms
	cur, prev any
}

// bucket returns the keys of window w (at position i in slidingWindows) at nowMs.
func (k *orgKeys) bucket(i int, w Window, nowMs int64) *bucketKeys {
	ms := w.Duration().Milliseconds()
	n := nowMs / ms
	if bk := k.buckets[i].Load(); bk != nil && bk.n == n {
		return bk
	}
	start := k.tag + "w|" + w.seconds() + "|"
	bk := &bucketKeys{n: n, ms: ms, cur: start + strconv.FormatInt(n, 10), prev: start + strconv.FormatInt(n-1, 10)}
	k.buckets[i].Store(bk)
	return bk
}

type orgPeriod struct{ org, period string }

// keyShard is one of the engine's 64 key caches (sharded so no lock is global).
type keyShard struct {
	mu sync.RWMutex
	m  map[orgPeriod]*orgKeys
}

var keySeed = maphash.MakeSeed()

// orgKeys returns the shared arguments of org's checks in per.
func (e *Engine) orgKeys(org string, per Period) *orgKeys {
	sh := &e.keys[maphash.String(keySeed, org)%uint64(len(e.keys))]
	k := orgPeriod{org, per.ID}
	sh.mu.RLock()
	v := sh.m[k]
	sh.mu.RUnlock()
	if v != nil {
		return v
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	v = &orgKeys{tag: tag, month: tag + "m|" + per.ID, dirty: tag + "d|" + per.ID,
		expire: per.End.Add(e.cfg.MonthRetention).Unix(), endMs: per.End.UnixMilli()}
	sh.mu.Lock()
	if sh.m == nil || len(sh.m) >= 4096 { // bounded: a shard that fills up starts over
		sh.m = make(map[orgPeriod]*orgKeys)
	}
	sh.m[k] = v
	sh.mu.Unlock()
	return v
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
// New samples the offset to Redis TIME once; if Redis is down it starts anyway and
// keeps trying in the background.
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
	}
	e.ttlArg = e.idemTTL
	e.cluster, _ = rdb.(*redis.ClusterClient)
	e.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = e.syncClock(ctx) // failure is retried by clockLoop
	cancel()
	e.wg.Add(1)
	go e.clockLoop()
	go e.loop()
	return e, nil
}

// Close stops the batching loop and the clock sampler. Checks queued but not yet
// sent fail with ErrClosed; a pipeline in flight completes first.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() { close(e.closing) })
	<-e.stopped
	e.wg.Wait()
	return nil
}

// Now is the local clock corrected by the last sampled offset to Redis TIME.
func (e *Engine) Now() time.Time {
	return e.cfg.Clock().Add(time.Duration(e.offset.Load()))
}

// Period is the billing period at Now for an org with the given anchor day.
func (e *Engine) Period(anchorDay int) Period { return PeriodAt(e.Now(), anchorDay) }

func (e *Engine) syncClock(ctx context.Context) error {
	t0 := e.cfg.Clock()
	rt, err := e.rdb.Time(ctx).Result()
	if err != nil {
		return err
	}
	t1 := e.cfg.Clock()
	e.offset.Store(int64(rt.Sub(t0.Add(t1.Sub(t0) / 2))))
	e.synced.Store(true)
	return nil
}

func (e *Engine) clockLoop() {
	defer e.wg.Done()
	for {
		wait := e.cfg.ClockSync
		if !e.synced.Load() {
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

// call is one check on its way through the batching loop. The loop owns it from
// the moment it is queued until it signals done.
type call struct {
	ctx    context.Context
	args   []any  // evalsha, sha, numkeys, keys..., argv...
	nums   []byte // the last ARGV, the packed numbers (kept for reuse)
	nowMs  int64  // the clock the check was built at
	org    string
	period Period
	req    Request // what the compact reply is decoded against
	reply  string  // "H", a replay, a decision stored for replays, or a packed decision
	err    error
	ask    string // a cluster node to send the check to with ASKING (see cluster.go)
	done   chan struct{}
}

func (e *Engine) getCall() *call { return e.calls.Get().(*call) }

func (e *Engine) putCall(c *call) {
	clear(c.args)
	c.args, c.ctx, c.reply, c.err, c.org, c.req, c.ask, c.nowMs = c.args[:0], nil, "", nil, "", Request{}, "", 0
	e.calls.Put(c)
}

// setReply stores cmd's reply or error in c.
func (c *call) setReply(cmd *redis.Cmd) {
	v, err := cmd.Result()
	c.reply, c.err = "", err
	if err != nil {
		return
	}
	if s, ok := v.(string); ok {
		c.reply = s
	} else {
		c.err = fmt.Errorf("quota: unexpected script reply of type %T", v)
	}
}

// parse decodes c's reply into a Result; see parseReply and parseCompact.
func (c *call) parse() (Result, byte, error) {
	if isPacked(c.reply) {
		return parseCompact(c.reply, &c.req, c.period, c.nowMs)
	}
	return parseReply(c.reply)
}

// build fills c with the EVALSHA arguments of req at now (the engine's clock,
// corrected to Redis TIME); see scripts/check.lua for ARGV. The numbers go packed
// into one argument and the bucket keys are named here: in the script, every argument
// and every number parsed or formatted costs Redis time (docs/PERFORMANCE.md).
func (e *Engine) build(c *call, req *Request, now time.Time) {
	per := e.periodAt(now, req.AnchorDay)
	k := e.orgKeys(req.Org, per)
	nowMs := now.UnixMilli()
	c.org, c.period, c.req, c.nowMs = req.Org, per, *req, nowMs
	idem := req.IdempotencyKey != ""
	nkeys := 2
	if idem {
		nkeys = 3
	}
	a := append(c.args[:0], "evalsha", checkSHA, nkeys, k.month, k.dirty)
	if idem {
		a = append(a, k.tag+"i|"+req.IdempotencyKey)
	}

	// Every window limited at any level is counted at every level.
	var mask uint8
	for _, ls := range [...][]Limit{req.Limits.Org, req.Limits.Team, req.Limits.User} {
		for _, l := range ls {
			mask |= l.Window.bit()
		}
	}
	nl := 1
	if req.Team != "" {
		nl++
		if req.User != "" {
			nl++
		}
	}
	force := 0.0
	if req.Mode == Shadow || req.Mode == Warn {
		force = 1
	}
	var windows [len(slidingWindows)]*bucketKeys
	var index [len(slidingWindows)]int // script window index by position in slidingWindows
	nw := 0
	for i, w := range slidingWindows {
		if mask&w.bit() != 0 {
			windows[nw] = k.bucket(i, w, nowMs)
			nw++
			index[i] = nw
		}
	}
	rows := len(req.Limits.Org)
	if nl > 1 {
		rows += len(req.Limits.Team)
		if nl > 2 {
			rows += len(req.Limits.User)
		}
	}
	b := appendNumbers(c.nums[:0], float64(req.Cost), force, float64(nowMs), float64(k.endMs), float64(k.expire),
		float64(nl), float64(nw), float64(rows))
	for _, bk := range windows[:nw] {
		b = appendNumbers(b, float64(bk.ms), float64(nowMs-bk.n*bk.ms))
	}
	b = appendRows(b, 1, req.Limits.Org, &index)
	if nl > 1 {
		b = appendRows(b, 2, req.Limits.Team, &index)
		if nl > 2 {
			b = appendRows(b, 3, req.Limits.User, &index)
		}
	}
	c.nums = b
	a = append(a, k.field(req.Metric))
	if nl > 1 {
		a = append(a, req.Metric+"|t|"+req.Team)
		if nl > 2 {
			a = append(a, req.Metric+"|u|"+req.Team+"|"+req.User)
		}
	}
	for _, bk := range windows[:nw] {
		a = append(a, bk.cur, bk.prev)
	}
	if idem {
		a = append(a, e.ttlArg)
		a = appendLabels(a, "o", req.Org, req.Limits.Org)
		if nl > 1 {
			a = appendLabels(a, "t", req.Team, req.Limits.Team)
			if nl > 2 {
				a = appendLabels(a, "u", req.User, req.Limits.User)
			}
		}
	}
	c.args = append(a, b)
}

// periodAt is PeriodAt, remembering the last period of each anchor day: computing
// one is a tenth of build.
func (e *Engine) periodAt(now time.Time, anchorDay int) Period {
	if anchorDay < 1 || anchorDay > 28 {
		anchorDay = 1
	}
	slot := &e.periods[anchorDay]
	if p := slot.Load(); p != nil && !now.Before(p.Start) && now.Before(p.End) {
		return *p
	}
	p := PeriodAt(now, anchorDay)
	slot.Store(&p)
	return p
}

// appendNumbers appends vs as little-endian doubles, as check.lua unpacks its last ARGV.
func appendNumbers(b []byte, vs ...float64) []byte {
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return b
}

// appendRows appends the rows of one level (1 org, 2 team, 3 user): level, window
// index (0 month, i the i-th sliding window), limit.
func appendRows(b []byte, level float64, limits []Limit, index *[len(slidingWindows)]int) []byte {
	for _, l := range limits {
		w := 0
		for i, sw := range slidingWindows {
			if sw == l.Window {
				w = index[i]
			}
		}
		b = appendNumbers(b, level, float64(w), float64(l.Limit))
	}
	return b
}

// appendLabels appends the reply labels of one level's rows, for a decision stored
// under an idempotency key: "letter|id|window|limit".
func appendLabels(a []any, letter, id string, limits []Limit) []any {
	for _, l := range limits {
		w := "M"
		if l.Window != Month {
			w = l.Window.seconds()
		}
		a = append(a, letter+"|"+id+"|"+w+"|"+strconv.FormatInt(l.Limit, 10))
	}
	return a
}

// Check decides one check. A denied check (Result.Allowed false) is not an error.
//
// Errors: ErrInvalid (joined, one per problem) for a bad request; ErrUnavailable
// when Redis did not answer (the check was counted at most once); ErrNotHydrated
// when the org's counters could not be restored; ErrClosed after Close; the
// context's error when ctx ends first (a check already sent may have counted).
func (e *Engine) Check(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	return e.check(ctx, req)
}

// check is Check of a request already validated: the Router validates each request
// once, before choosing the engine.
func (e *Engine) check(ctx context.Context, req Request) (Result, error) {
	c := e.getCall()
	e.build(c, &req, e.Now())
	var refused time.Time // the first refusal without a run: the retry budget starts there
	hydrated := ""        // the period restored, if any: a re-send may fall in the next
	for tries := 0; ; {
		if c.ask != "" {
			e.sendAsking(ctx, c)
		} else if err := e.submit(ctx, c); err != nil {
			return Result{}, err // c may still be owned by the loop: not recycled
		}
		if c.err != nil {
			if e.cluster != nil && refused.IsZero() {
				refused = time.Now()
			}
			if pause, ok := e.retryDelay(c, refused, tries); ok {
				tries++
				if err := e.sleep(ctx, pause); err != nil {
					e.putCall(c)
					return Result{}, err
				}
				e.build(c, &req, e.Now()) // counted when sent: a window bucket may have ended
				continue
			}
			err := c.err
			e.putCall(c)
			return Result{}, checkError(err)
		}
		res, status, err := c.parse()
		if status != statusHydrate || err != nil {
			e.putCall(c)
			return res, err
		}
		if hydrated == c.period.ID {
			e.putCall(c)
			return Result{}, fmt.Errorf("check %s: %w: marker still missing after hydration", req.Org, ErrNotHydrated)
		}
		if err := e.hydrate(ctx, c.org, c.period); err != nil {
			e.putCall(c)
			return Result{}, err
		}
		hydrated = c.period.ID
		e.build(c, &req, e.Now())
	}
}

func checkError(err error) error {
	if errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("quota check: %w: %w", ErrUnavailable, err)
}

// submit hands c to the batching loop and waits for its answer.
func (e *Engine) submit(ctx context.Context, c *call) error {
	c.ctx, c.err, c.reply = ctx, nil, ""
	select {
	case e.queue <- c:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closing:
		return ErrClosed
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.stopped:
		select {
		case <-c.done:
			return nil
		default:
			return ErrClosed
		}
	}
}

// loop is the batching goroutine: it takes whatever checks are waiting, up to
// MaxBatch, sends them as one pipeline and wakes their callers. While a pipeline is
// in flight new checks queue up, so batches grow with load on their own.
func (e *Engine) loop() {
	defer close(e.stopped)
	batch := make([]*call, 0, e.cfg.MaxBatch)
	var p pipeState
	for {
		select {
		case c := <-e.queue:
			batch = append(batch[:0], c)
		fill:
			for len(batch) < e.cfg.MaxBatch {
				select {
				case c := <-e.queue:
					batch = append(batch, c)
				default:
					break fill
				}
			}
			// The pipeline does not use the callers' contexts: one caller giving up must
			// not fail the others' checks. The client's read timeout bounds it.
			e.exec(context.Background(), batch, &p)
			for _, c := range batch {
				c.done <- struct{}{}
			}
			clear(batch)
		case <-e.closing:
			for {
				select {
				case c := <-e.queue:
					c.err = ErrClosed
					c.done <- struct{}{}
				default:
					return
				}
			}
		}
	}
}

// pipeState is scratch space reused across pipelines by one goroutine.
type pipeState struct {
	cmds  []*redis.Cmd
	again []int
}

// exec runs calls as one pipeline of EVALSHAs and stores each reply or error in its
// call. Calls whose context has already ended are not sent.
//
// NOSCRIPT (after a restart, failover or SCRIPT FLUSH) means the command did not
// run, so exactly those commands are sent again, with the script's body. Nothing
// else is ever re-sent.
func (e *Engine) exec(ctx context.Context, calls []*call, p *pipeState) {
	p.cmds = p.cmds[:0]
	pipe := e.rdb.Pipeline()
	for _, c := range calls {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			p.cmds = append(p.cmds, nil)
			continue
		}
		cmd := redis.NewCmd(ctx, c.args...)
		_ = pipe.Process(ctx, cmd)
		p.cmds = append(p.cmds, cmd)
	}
	if pipe.Len() == 0 {
		return
	}
	n, t0 := pipe.Len(), time.Now() // Exec empties the pipeline
	_, _ = pipe.Exec(ctx)           // errors are per command
	if e.cfg.OnPipeline != nil {
		e.cfg.OnPipeline(n, time.Since(t0))
	}
	p.again = p.again[:0]
	for i, cmd := range p.cmds {
		if cmd == nil {
			continue
		}
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			p.again = append(p.again, i)
			continue
		}
		calls[i].setReply(cmd)
	}
	if len(p.again) == 0 {
		return
	}
	// Load the script for the EVALSHAs to come (on a cluster, on every shard), and
	// re-run the refused checks with EVAL so they cannot hit NOSCRIPT again.
	_ = e.rdb.ScriptLoad(ctx, checkSrc).Err()
	pipe = e.rdb.Pipeline()
	for _, i := range p.again {
		args := make([]any, len(calls[i].args))
		copy(args, calls[i].args)
		args[0], args[1] = "eval", checkSrc
		p.cmds[i] = redis.NewCmd(ctx, args...)
		_ = pipe.Process(ctx, p.cmds[i])
	}
	_, _ = pipe.Exec(ctx)
	for _, i := range p.again {
		calls[i].setReply(p.cmds[i])
	}
}

// CheckBatch decides several checks in one pipeline, each independently, and
// returns a result or an error for each, in order. The errors are those of Check.
func (e *Engine) CheckBatch(ctx context.Context, reqs []Request) ([]Result, []error) {
	return e.checkBatch(ctx, reqs, true)
}

// checkBatch is CheckBatch, validating each request unless the caller (the Router)
// already has.
func (e *Engine) checkBatch(ctx context.Context, reqs []Request, validate bool) ([]Result, []error) {
	results := make([]Result, len(reqs))
	errs := make([]error, len(reqs))
	select {
	case <-e.closing:
		for i := range errs {
			errs[i] = ErrClosed
		}
		return results, errs
	default:
	}
	calls := make([]*call, 0, len(reqs))
	index := make([]int, 0, len(reqs))
	now := e.Now()
	for i := range reqs {
		if validate {
			if err := reqs[i].Validate(); err != nil {
				errs[i] = err
				continue
			}
		}
		c := &call{ctx: ctx}
		e.build(c, &reqs[i], now)
		calls = append(calls, c)
		index = append(index, i)
	}
	var p pipeState
	start := time.Now()
	hydratedOrg := map[string]bool{} // org|period restored once already
	for tries := 0; len(calls) > 0; {
		var asks []*call
		sent := calls[:0:0]
		for _, c := range calls {
			if c.ask != "" {
				asks = append(asks, c)
			} else {
				sent = append(sent, c)
			}
		}
		e.exec(ctx, sent, &p)
		for _, c := range asks {
			e.sendAsking(ctx, c)
		}
		var retryCalls []*call
		var retryIndex []int
		var pause time.Duration
		resend := false
		hydrated := map[string]error{}
		for j, c := range calls {
			i := index[j]
			if c.err != nil {
				if d, ok := e.retryDelay(c, start, tries); ok {
					pause, resend = max(pause, d), true
					c.err = nil
					retryCalls = append(retryCalls, c)
					retryIndex = append(retryIndex, i)
					continue
				}
				errs[i] = checkError(c.err)
				continue
			}
			res, status, err := c.parse()
			if status != statusHydrate || err != nil {
				results[i], errs[i] = res, err
				continue
			}
			if hydratedOrg[c.org+"|"+c.period.ID] {
				errs[i] = fmt.Errorf("check %s: %w: marker still missing after hydration", c.org, ErrNotHydrated)
				continue
			}
			key := c.org + "|" + c.period.ID
			herr, done := hydrated[key]
			if !done {
				herr = e.hydrate(ctx, c.org, c.period)
				hydrated[key] = herr
			}
			if herr != nil {
				errs[i] = herr
				continue
			}
			c.err, c.reply = nil, ""
			retryCalls = append(retryCalls, c)
			retryIndex = append(retryIndex, i)
		}
		for k := range hydrated {
			hydratedOrg[k] = true
		}
		if resend {
			tries++
			if err := e.sleep(ctx, pause); err != nil {
				for _, i := range retryIndex {
					errs[i] = err
				}
				return results, errs
			}
		}
		// Sent again as built now: a window bucket may have ended meanwhile.
		now := e.Now()
		for j, c := range retryCalls {
			e.build(c, &reqs[retryIndex[j]], now)
		}
		calls, index = retryCalls, retryIndex
	}
	return results, errs
}

// DrainDirty takes the month counters of org that changed in period (an ID such as
// "2026-11") since the last drain, with their current values. A counter that
// changes afterwards is marked dirty again. The caller owns the values: if it
// cannot persist them it must fall back to MonthUsage, which reads all of them.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails (the
// counters taken by the chunks already drained are returned with the error).
func (e *Engine) DrainDirty(ctx context.Context, org, period string) (map[Counter]int64, error) {
	if err := validOrgPeriod(org, period); err != nil {
		return nil, err
	}
	const chunk = 1000
	tag := orgTag(e.cfg.KeyPrefix, org)
	keys := []string{tag + "d|" + period, tag + "m|" + period}
	out := map[Counter]int64{}
	for {
		vals, err := drainScript.Run(ctx, e.rdb, keys, chunk).StringSlice()
		if err != nil {
			return out, fmt.Errorf("drain %s %s: %w: %w", org, period, ErrUnavailable, err)
		}
		if err := addCounters(out, vals); err != nil {
			return out, err
		}
		if len(vals)/2 < chunk-1 { // -1: a chunk may have held the set's keeper member '|'
			return out, nil
		}
	}
}

// MonthUsage reads every month counter of org in period.
//
// Errors: ErrInvalid for a bad org or period; ErrUnavailable when Redis fails.
func (e *Engine) MonthUsage(ctx context.Context, org, period string) (map[Counter]int64, error) {
	if err := validOrgPeriod(org, period); err != nil {
		return nil, err
	}
	key := orgTag(e.cfg.KeyPrefix, org) + "m|" + period
	out := map[Counter]int64{}
	var cursor uint64
	for {
		vals, next, err := e.rdb.HScan(ctx, key, cursor, "", 1000).Result()
		if err != nil {
			return nil, fmt.Errorf("month usage %s %s: %w: %w", org, period, ErrUnavailable, err)
		}
		for i := 0; i+1 < len(vals); i += 2 {
			if vals[i] == markerField {
				vals[i], vals[i+1] = vals[len(vals)-2], vals[len(vals)-1]
				vals = vals[:len(vals)-2]
				break
			}
		}
		if err := addCounters(out, vals); err != nil {
			return nil, err
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

func addCounters(out map[Counter]int64, vals []string) error {
	for i := 0; i+1 < len(vals); i += 2 {
		c, err := parseField(vals[i])
		if err != nil {
			return err
		}
		v, err := strconv.ParseInt(vals[i+1], 10, 64)
		if err != nil {
			return fmt.Errorf("quota: counter %q: %w", vals[i], err)
		}
		out[c] = v
	}
	return nil
}

func validOrgPeriod(org, period string) error {
	if !validID(org) {
		return fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	if _, err := time.Parse("2006-01", period); err != nil || len(period) != 7 {
		return fmt.Errorf("%w: period %q is not YYYY-MM", ErrInvalid, period)
	}
	return nil
}
