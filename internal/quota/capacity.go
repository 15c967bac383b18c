package quota

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Capacities (docs/ARCHITECTURE.md "Capacities and fair share"). A capacity lives in
// one place, a hash slot of the default pool's Redis (keys capacityKeys), while orgs
// live in their pools and slots, so a check cannot take units from both in one
// script. Instead each replica draws on a capacity through grants, one per capacity
// and member (grant): units capacity.lua counted in the capacity's precise sliding
// window, held by this replica to admit that member's checks. A check takes its cost
// from the grant in process before its own limits are decided, and gives it back to
// the grant when they refuse it (or it errs, or it was a replay): all or nothing.
//
// A grant ends with the sub-bucket it was counted in (measured from before the
// script ran, so it ends early, never late) and after at most grantMaxLife; what it
// did not admit is given back to that sub-bucket by the next draw. So every unit
// admitted was counted in the sub-bucket it was admitted in, and no real span of one
// window admits more than the limit, whatever the replicas. A replica that dies with
// grants leaves their units counted until they leave the window: the capacity loses,
// per dead replica, at most its live grants, for at most one window. A call to
// capacity.lua that fails (a timeout, a caller gone, a broken connection) may have run
// with its reply lost, so what it gave back counts as given and is never sent again:
// given twice, units would come off a sub-bucket that other grants' admitted units are
// counted in, and the window would admit past its limit
// (TestCapacityGiveBackWhoseReplyIsLostIsNotGivenTwice). When it did not run, those
// units stay counted until they leave the window, as do the units of a grant whose
// reply was lost: at most a grant per failed call, erring toward refusing. A grant is
// sized to the member's rate on this replica over its life, at least the check's
// cost and at most a sixteenth of the limit per replica, so fair shares are held to
// within the grants the other replicas hold.
//
// Fair share: above the capacity's saturation point a member gets a grant only within
// its weighted max-min fair share (capacity.lua's fair), and a refused member is
// refused in process until the retry capacity.lua gave (at most grantMaxLife), the
// checks that cost as much as the refused one or more (a smaller one may fit), so a
// saturated capacity costs Redis one call per member and replica per refusal spell,
// not one per check.

//go:embed scripts/capacity.lua
var capacitySrc string

var capacityScript = redis.NewScript(capacitySrc)

// grantMaxLife bounds a grant's life, and a refusal's in-process spell: the time
// fair shares take to move with the members' weights and demands.
const grantMaxLife = 250 * time.Millisecond

// grantMinKeys is the number of (capacity, member) grants above which a draw drops
// the ended ones with nothing to give back.
const grantMinKeys = 4096

// capacityKeys are the keys of capacity c: its own slot, named by its id and window,
// or for a fair-share org limit by the org, metric and window. The window is in the
// name because the counts are in its sub-buckets: under a longer one they would read
// as the future and never leave (TestCapacityWindowChangeCountsApart), so a capacity
// whose window changes starts the new one empty. Ids never contain '|', so the two
// kinds and every org's own keys stay apart.
func capacityKeys(prefix string, c *Capacity) [5]string {
	var tag string
	if c.FairShare {
		tag = prefix + ":{fs|" + c.ID + "|" + c.Metric + "|" + windowSeconds(c.Window) + "}|"
	} else {
		tag = prefix + ":{cap|" + c.ID + "|" + windowSeconds(c.Window) + "}|"
	}
	return [5]string{tag + "m", tag + "u", tag + "a", tag + "w", tag + "r"}
}

// saturationUnits is limit x saturation, floored: the units above which shares apply.
func (c *Capacity) saturationUnits() int64 {
	s := c.Saturation
	if s == 0 {
		s = DefaultSaturation
	}
	return int64(math.Floor(float64(c.Limit) * s))
}

// grantKey names a grant: one capacity (its keys' tag) and one member.
type grantKey struct {
	tag    string
	member string
}

// grant is this replica's units of one capacity for one member.
type grant struct {
	fill sync.Mutex // held by the one draw that asks Redis for the next grant

	mu          sync.Mutex
	units       int64     // left to admit
	at          int64     // the sub-bucket they were counted in
	ends        time.Time // local monotonic: no unit is admitted from it at or after
	back        int64     // units of an ended grant to give back with the next draw
	backAt      int64     // their sub-bucket
	refused     time.Time // refused in process until then, checks costing at least refusedCost
	refusedCost int64     // a smaller check may fit: Redis decides it
	retryAt     time.Time // when the refusal's cost fits, as capacity.lua told
	capped      bool      // since the last draw, a check drew on it and its member's own limit refused it
	why         string    // the refusal's kind: "c" (full) or "f" (past the share)
	rate        rateCounter
}

// capacities holds this replica's grants.
type capacities struct {
	r  *Engines
	mu sync.Mutex
	m  map[grantKey]*grant
}

func newCapacities(r *Engines) *capacities {
	return &capacities{r: r, m: map[grantKey]*grant{}}
}

// drawn is one draw a check took, to give back if the check is not admitted.
type drawn struct {
	g     *grant
	units int64
	at    int64
	level vocab.Level // the member's: the org's, or for a fair-share org limit the team's
}

// memberLevel is the level of d's member.
func (d *CapacityDraw) memberLevel() vocab.Level {
	if d.FairShare {
		return vocab.LevelTeam
	}
	return vocab.LevelOrg
}

// capacityRefusal is a draw the capacity refused.
type capacityRefusal struct {
	d     *CapacityDraw
	retry time.Duration
}

func (c *capacities) grantOf(k grantKey) *grant {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.m[k]
	if g == nil {
		if len(c.m) >= grantMinKeys {
			c.prune(time.Now())
		}
		g = &grant{}
		c.m[k] = g
	}
	return g
}

// prune drops the grants that ended with nothing to give back and no refusal in
// force (c.mu held).
func (c *capacities) prune(now time.Time) {
	for k, g := range c.m {
		if g.mu.TryLock() {
			idle := !now.Before(g.ends) && g.back == 0 && !now.Before(g.refused)
			g.mu.Unlock()
			if idle && g.fill.TryLock() {
				delete(c.m, k)
				g.fill.Unlock()
			}
		}
	}
}

// costOf is the cost of metric in req (0 when it does not name it).
func costOf(req *Request, metric string) int64 {
	if metric == req.Metric {
		return req.Cost
	}
	for i := range req.More {
		if req.More[i].Metric == metric {
			return req.More[i].Cost
		}
	}
	return 0
}

// draw takes req's cost from every capacity it names, all or nothing: the draws it
// took (to give back with giveBack when the check is not admitted), or the first
// refusal (nothing taken), or an error (nothing taken).
func (c *capacities) draw(ctx context.Context, req *Request) ([]drawn, *capacityRefusal, error) {
	var out []drawn
	for i := range req.Capacities {
		d := &req.Capacities[i]
		cost := costOf(req, d.Metric)
		if cost == 0 {
			continue
		}
		dr, ref, err := c.drawOne(ctx, d, cost)
		if err != nil || ref != nil {
			c.giveBack(out, nil)
			return nil, ref, err
		}
		out = append(out, dr)
	}
	return out, nil, nil
}

// drawOne takes cost from the grant of d's capacity and member, asking Redis for the
// next grant when this one cannot give it.
func (c *capacities) drawOne(ctx context.Context, d *CapacityDraw, cost int64) (drawn, *capacityRefusal, error) {
	if cost > d.Limit {
		// never fits: refused with a window's retry, and neither Redis nor the grant
		// hears of it, since in capacity.lua a refusal is a member's demand and makes
		// every member share for a window
		return drawn{}, &capacityRefusal{d: d, retry: d.Window.Duration()}, nil
	}
	keys := capacityKeys(c.r.cfg.Engine.KeyPrefix, &d.Capacity)
	g := c.grantOf(grantKey{tag: keys[0], member: d.Member})
	now := time.Now()
	g.rate.count(now.UnixNano(), cost)
	if dr, ref, ok := g.take(now, cost, d); ok {
		return dr, ref, nil
	}
	g.fill.Lock()
	defer g.fill.Unlock()
	now = time.Now()
	if dr, ref, ok := g.take(now, cost, d); ok { // another draw refilled it meanwhile
		return dr, ref, nil
	}
	return c.refill(ctx, g, keys, d, cost, now)
}

// take takes cost from g if it can answer without Redis: a live grant holding cost,
// or a refusal in force. ok is false when Redis must be asked.
func (g *grant) take(now time.Time, cost int64, d *CapacityDraw) (drawn, *capacityRefusal, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now.Before(g.refused) && cost >= g.refusedCost {
		return drawn{}, &capacityRefusal{d: d, retry: max(g.retryAt.Sub(now), time.Millisecond)}, true
	}
	if now.Before(g.ends) && g.units >= cost {
		g.units -= cost
		return drawn{g: g, units: cost, at: g.at, level: d.memberLevel()}, nil, true
	}
	return drawn{}, nil, false
}

// refill asks capacity.lua for g's next grant (g.fill held), giving back what the
// ended one did not admit in the same call, and takes cost from it.
func (c *capacities) refill(ctx context.Context, g *grant, keys [5]string, d *CapacityDraw, cost int64, now time.Time) (drawn, *capacityRefusal, error) {
	g.mu.Lock()
	if g.units > 0 { // ended, or too small for cost: what it holds goes back now
		if g.back > 0 && g.backAt != g.at {
			g.back = 0 // an older sub-bucket's units stay counted: that only errs toward refusing
		}
		g.back, g.backAt, g.units = g.back+g.units, g.at, 0
	}
	back, backAt := g.back, g.backAt
	if back == 0 {
		backAt = -1
	}
	capped := 0
	if g.capped {
		capped, g.capped = 1, false
	}
	g.mu.Unlock()

	want := max(cost, int64(math.Ceil(float64(g.rate.rate.Load())*grantMaxLife.Seconds()*1.25)))
	want = min(want, max(cost, d.Limit/int64(16*c.r.cfg.Replicas)))
	wms := d.Window.Duration().Milliseconds()
	sent := time.Now()
	v, ran, err := c.r.runCapacity(ctx, keys, d.ID, d.Member, "d", PreciseSubBuckets, wms, d.Limit, d.saturationUnits(),
		d.Member, d.Weight, cost, want, backAt, back, 2*wms+60_000, capped)
	if ran {
		g.mu.Lock()
		g.back -= back // given back, even when the reply is lost
		g.mu.Unlock()
	}
	if err != nil {
		return drawn{}, nil, err
	}
	rep, err := parseDraw(v)
	if err != nil {
		return drawn{}, nil, fmt.Errorf("capacity %s: %w", d.ID, err)
	}
	c.r.metrics.capacityDraw(d, rep)
	g.mu.Lock()
	defer g.mu.Unlock()
	if rep.why != "" {
		g.refused, g.refusedCost, g.retryAt, g.why = sent.Add(min(rep.retry, grantMaxLife)), cost, sent.Add(rep.retry), rep.why
		return drawn{}, &capacityRefusal{d: d, retry: rep.retry}, nil
	}
	life := min(rep.left, grantMaxLife)
	g.units, g.at, g.ends, g.refused = rep.granted-cost, rep.at, sent.Add(life), time.Time{}
	dc := *d // the request's may change once its check is answered
	time.AfterFunc(time.Until(g.ends), func() { c.returnUnused(g, keys, &dc) })
	return drawn{g: g, units: cost, at: rep.at, level: d.memberLevel()}, nil, nil
}

// returnUnused gives back to Redis what g holds once it ended, so units a member's
// checks did not take (its own limits refused them, or its load stopped) return to
// the capacity within grantMaxLife of their draw rather than with the member's next
// draw. A draw refilling g meanwhile gives them back itself; a failure counts as
// given back.
func (c *capacities) returnUnused(g *grant, keys [5]string, d *CapacityDraw) {
	if !g.fill.TryLock() {
		return
	}
	defer g.fill.Unlock()
	g.mu.Lock()
	if time.Now().Before(g.ends) || g.units+g.back == 0 {
		g.mu.Unlock()
		return
	}
	if g.units > 0 {
		if g.back > 0 && g.backAt != g.at {
			g.back = 0 // an older sub-bucket's units stay counted: that only errs toward refusing
		}
		g.back, g.backAt, g.units = g.back+g.units, g.at, 0
	}
	back, backAt := g.back, g.backAt
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), c.r.cfg.RedisTimeout)
	defer cancel()
	wms := d.Window.Duration().Milliseconds()
	if _, ran, _ := c.r.runCapacity(ctx, keys, d.ID, d.Member, "r", PreciseSubBuckets, wms, d.Limit, d.saturationUnits(),
		d.Member, d.Weight, 0, 0, backAt, back, 2*wms+60_000, 0); ran {
		g.mu.Lock()
		g.back -= back
		g.mu.Unlock()
	}
}

// runCapacity runs capacity.lua on keys, on the default pool's Redis, behind the
// breaker of the primary holding their slot, as an org's checks run behind theirs:
// while that Redis does not answer, a draw fails at once and its check is answered by
// its fail mode, rather than waiting its timeout with every check of its member
// queued behind it (TestCapacityDrawsBehindTheBreaker: 27 checks in 2 s from 8
// callers of a hung Redis, against hundreds of thousands without a capacity). ran says
// the call went to Redis: it may have run even when it failed (its reply lost).
// Errors wrap ErrUnavailable, or are the caller's context's.
func (r *Engines) runCapacity(ctx context.Context, keys [5]string, id, member string, args ...any) ([]any, bool, error) {
	b, err := r.backendFor(r.defaultURL)
	if err != nil {
		return nil, false, err
	}
	// the keys' hash tag, which breakerFor wraps in braces again
	tag := keys[0][strings.IndexByte(keys[0], '{')+1 : strings.IndexByte(keys[0], '}')]
	done, err := b.breakerFor(tag).Allow()
	if err != nil {
		return nil, false, unavailable(member, b.name, fmt.Errorf("capacity %s: %w", id, err))
	}
	v, err := capacityScript.Run(ctx, b.rdb, keys[:], args...).Slice()
	switch {
	case err != nil && ctx.Err() != nil:
		err = ctx.Err()
	case err != nil:
		err = unavailable(member, b.name, fmt.Errorf("capacity %s: %w", id, err))
	}
	done(redisFailure(err))
	return v, true, err
}

// giveBack returns draws a check did not use to their grants: to the live grant they
// came from, or, once it ended, to be given back to their sub-bucket by the next draw
// (a grant ended twice before then keeps only the latest sub-bucket's: the older
// units stay counted, which only errs toward refusing). refused is where the check's
// own limits refused it (nil: they did not): a limit of the member's own level (the
// org's, or for a fair-share org limit the team's) caps what the member wants, and
// its next draw tells capacity.lua so, since what such a member wants is what its
// limit lets it use, not its share.
func (c *capacities) giveBack(ds []drawn, refused *vocab.Blocked) {
	for _, d := range ds {
		g := d.g
		g.mu.Lock()
		if refused != nil && !refused.FairShare && refused.Level == d.level {
			g.capped = true
		}
		switch {
		case d.at == g.at && time.Now().Before(g.ends):
			g.units += d.units
		case d.at == g.backAt || g.back == 0:
			g.back, g.backAt = g.back+d.units, d.at
		}
		g.mu.Unlock()
	}
}

// drawReply is capacity.lua's answer to a draw.
type drawReply struct {
	granted, at, used, mine, share int64
	left, retry                    time.Duration
	why                            string
}

func parseDraw(v []any) (drawReply, error) {
	if len(v) != 8 {
		return drawReply{}, fmt.Errorf("%w: capacity reply of %d values", ErrBadReply, len(v))
	}
	var n [7]int64
	for i := range n {
		x, ok := v[i].(int64)
		if !ok {
			return drawReply{}, fmt.Errorf("%w: capacity reply value %d is %T", ErrBadReply, i, v[i])
		}
		n[i] = x
	}
	why, _ := v[7].(string)
	return drawReply{granted: n[0], left: time.Duration(n[1]) * time.Millisecond, at: n[2], used: n[3], mine: n[4],
		share: n[5], retry: time.Duration(n[6]) * time.Millisecond, why: why}, nil
}

// refusal is the answer to a check a capacity refused: denied (in Enforce mode),
// naming the capacity, or for a fair-share org limit the org's limit.
func (r *capacityRefusal) blocked(req *Request) *vocab.Blocked {
	d := r.d
	if d.FairShare {
		return &vocab.Blocked{Metric: d.Metric, Level: vocab.LevelOrg, ID: req.Org, Window: d.Window, FairShare: true}
	}
	return &vocab.Blocked{Metric: d.Metric, Level: vocab.LevelCapacity, ID: d.ID, Window: d.Window}
}

// CapacityWindow reads capacity c's current window: what is used, and each active
// member's weight, use and fair share. Errors wrap ErrInvalid for a bad capacity and
// ErrUnavailable when its Redis does not answer.
func (r *Engines) CapacityWindow(ctx context.Context, c Capacity) (CapacityWindow, error) {
	d := CapacityDraw{Capacity: c, Member: "view", Weight: 1}
	if d.Metric == "" {
		d.Metric = "view"
	}
	if err := d.validate(); err != nil {
		return CapacityWindow{}, err
	}
	keys := capacityKeys(r.cfg.Engine.KeyPrefix, &c)
	wms := c.Window.Duration().Milliseconds()
	v, _, err := r.runCapacity(ctx, keys, c.ID, "view", "v", PreciseSubBuckets, wms, c.Limit, d.saturationUnits(),
		"", 1, 0, 0, -1, 0, 2*wms+60_000, 0)
	if err != nil {
		return CapacityWindow{}, err
	}
	if len(v) == 0 || (len(v)-1)%4 != 0 {
		return CapacityWindow{}, fmt.Errorf("%w: capacity view of %d values", ErrBadReply, len(v))
	}
	used, _ := v[0].(int64)
	w := CapacityWindow{Used: used, Limit: c.Limit, Saturated: used >= d.saturationUnits()}
	for i := 1; i+3 < len(v); i += 4 {
		id, _ := v[i].(string)
		wt, _ := v[i+1].(int64)
		u, _ := v[i+2].(int64)
		sh, _ := v[i+3].(int64)
		w.Members = append(w.Members, CapacityMember{ID: id, Weight: wt, Used: u, Share: sh})
	}
	return w, nil
}

// capacityDraws are the draws of a batch's checks on their capacities, made before
// the checks' own limits are decided and settled once they are.
type capacityDraws struct {
	taken map[int][]drawn        // by check index: what to give back if not admitted
	would map[int]*vocab.Blocked // by check index: a refusal of a Shadow or Warn check
}

// draw draws check i's cost on its capacities. It reports whether the check goes on
// to its own limits; when it does not, the check is answered: refused by a capacity
// (Enforce), or failed (the capacity's Redis did not answer and the route's fail mode
// is FailClosed). A capacity that cannot be reached under another fail mode is left
// out of the decision, the answer marked degraded.
func (d *capacityDraws) draw(ctx context.Context, r *Engines, cs []Check, i int) bool {
	c := &cs[i]
	ds, ref, err := r.caps.draw(ctx, &c.Request)
	switch {
	case err != nil:
		if ctx.Err() != nil {
			c.Err = err
			return false
		}
		c.Outcome.Degraded, c.Outcome.Pool = true, DefaultPool
		if c.Route.FailMode == vocab.FailOpen || c.Route.FailMode == vocab.FailLocal {
			return true
		}
		c.Err = err
		return false
	case ref != nil:
		b := ref.blocked(&c.Request)
		if c.Request.Mode != "" && c.Request.Mode != vocab.Enforce {
			if d.would == nil {
				d.would = map[int]*vocab.Blocked{}
			}
			d.would[i] = b
			return true
		}
		c.Result = vocab.Result{BlockedAt: b, RetryAfter: max(ref.retry, time.Millisecond)}
		return false
	}
	if len(ds) > 0 {
		if d.taken == nil {
			d.taken = map[int][]drawn{}
		}
		d.taken[i] = ds
	}
	return true
}

// settle gives back the draws of the checks that were not admitted (refused, failed,
// or replays that counted nothing), and tells a Shadow or Warn check a capacity would
// have blocked it.
func (d *capacityDraws) settle(r *Engines, cs []Check) {
	for i, ds := range d.taken {
		c := &cs[i]
		switch {
		case c.Err == nil && !c.Result.Allowed && !c.Result.Replayed:
			r.caps.giveBack(ds, c.Result.BlockedAt)
		case c.Err != nil || !c.Result.Allowed || c.Result.Replayed:
			r.caps.giveBack(ds, nil)
		}
	}
	for i, b := range d.would {
		if c := &cs[i]; c.Err == nil && c.Result.WouldBlock == nil {
			c.Result.WouldBlock = b
		}
	}
}
