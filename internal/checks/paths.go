package checks

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Paths is the answer to CheckPaths.
type Paths struct {
	// Checks describes each input, in order, by its own level and those above it.
	Checks []PathCheck
	// Refused is how many inputs were not decided (their PathCheck's Err).
	Refused int
	// Allowed is false when some decided path was denied (a refused input is not a
	// denied path: it says so in Refused). RateLimit describes the first denied
	// path, else the tightest level of all (when HasRateLimit); RetryAfter is the
	// denied path's, in whole seconds. Paths are in the order they are decided:
	// deepest first (user, team, org), then in the order of their first input.
	Allowed      bool
	RateLimit    RateLimit
	HasRateLimit bool
	RetryAfter   int64
	// Levels is every limit of the paths, each metric named, for the RateLimit-Policy
	// field (PolicyField); Violated names the limit that denied the first denied path.
	Levels   []vocab.LevelStatus
	Violated string
	// Warning is the first warning of a warn-mode path; Degraded whether some path
	// was decided by its fail mode.
	Warning  string
	Degraded bool
}

// PathCheck describes one input of CheckPaths: whether its path was allowed, and
// (when HasRateLimit) its tightest limit. Err, when not nil, says why the input was
// not decided (InputFault: it names no check, or its path names more metrics than a
// check may); Allowed is then false and nothing was counted for it.
type PathCheck struct {
	Metric       string
	Allowed      bool
	RateLimit    RateLimit
	HasRateLimit bool
	Err          error
}

// InputError says which input of CheckPaths met an error of the service (not
// InputFault), which fails the whole call.
type InputError struct {
	Index int
	Err   error
}

func (e *InputError) Error() string { return fmt.Sprintf("input %d: %v", e.Index, e.Err) }

// Unwrap returns the refusal, which carries the kind.
func (e *InputError) Unwrap() error { return e.Err }

// pathCheck is one input's check, resolved. It carries what a path needs of the
// resolved input, not the whole: a call's inputs and groups are made per call.
type pathCheck struct {
	path
	group int   // index of its path's group; -1 when err
	err   error // why it was not decided (InputFault), or nil
}

// path is what deciding and describing a path needs of a resolved input.
type path struct {
	req   quota.Request
	route vocab.Route
	mode  vocab.Mode
	price pricing // its org's rates and its path's spend limits (money.go)
}

// group is one path: the deepest of its inputs' checks, decided once.
type group struct {
	path
	res   vocab.Result
	oc    quota.Outcome
	first int   // the index of its first input
	err   error // why the path was not decided (InputFault), or nil
}

// CheckPaths decides several checks the way Envoy's descriptors ask for them: the
// checks that lie on one org -> team -> user path of one metric are decided as one
// atomic check (the deepest), counted once with the largest of their costs; paths that
// end at the same org, team and user and differ only in metric are one multi-metric
// check, all or nothing; checks on different paths are each decided on their own, in
// one pipelined batch.
//
// An input that cannot be decided for a fault of its own (InputFault: malformed, an
// unknown team, user or metric, a cost past a bound) is refused alone: its PathCheck
// carries the error, nothing is counted for it, and the other inputs are decided as
// if it had not been given. A path is never split: one whose inputs name more than
// quota.MaxMetrics metrics is refused whole, every input of it, counting nothing.
// Any other error (a store down, too much in flight, the caller gone) fails the
// whole call: an *InputError naming the input when met resolving it, before
// anything is counted, or the engine's. Errors carry Check's kinds.
func (s *Service) CheckPaths(ctx context.Context, c Caller, ins []Input) (Paths, error) {
	enter(ctx, "checks.CheckPaths")
	if s.engine == nil {
		return Paths{}, ErrNoEngine
	}
	if len(ins) == 0 {
		return Paths{}, derrors.E(derrors.Invalid, "no check to decide", nil)
	}
	cs := make([]pathCheck, len(ins))
	slab := make([]vocab.Limit, 0, 8*len(ins)) // the inputs' limits, when they fit
	for i, in := range ins {
		r, err := s.resolve(ctx, c, in, &slab)
		if err != nil && !InputFault(err) {
			return Paths{}, &InputError{Index: i, Err: err}
		}
		cs[i] = pathCheck{path: path{req: r.req, route: r.route, mode: r.mode, price: r.price}, err: err, group: -1}
	}
	gs := pathGroups(cs)
	for i := range gs {
		g := &gs[i]
		if n := 1 + len(g.req.More); n > quota.MaxMetrics {
			g.err = derrors.E(derrors.Invalid, fmt.Sprintf("its path names %d metrics, more than the %d a check may: the path is refused whole", n, quota.MaxMetrics), nil)
			continue
		}
		// a path's spend is priced once, from its merged costs
		if err := price(&g.req, g.price); err != nil {
			if !InputFault(err) {
				return Paths{}, &InputError{Index: g.first, Err: err}
			}
			g.err = err
		}
	}
	if err := s.decidePaths(ctx, gs); err != nil {
		return Paths{}, err
	}
	t := time.Time{}
	for _, c := range cs {
		if c.group >= 0 {
			t = now(s.engine, c.route)
			break
		}
	}
	return describePaths(cs, gs, t), nil
}

// InputFault says whether err, met deciding an input, is the input's own fault (it
// names no check: malformed, unknown, past a bound, refused by a rule) rather than
// the service's (a store down, too much in flight, the caller gone, a bug: the
// kinds whose words a caller is not told). Only the service's fail a CheckPaths call.
func InputFault(err error) bool {
	switch derrors.KindOf(err) {
	case derrors.Internal, derrors.Unavailable, derrors.Overloaded, derrors.Canceled:
		return false
	}
	return true
}

// pathGroups gathers the checks that lie on one org -> team -> user path of one
// metric into groups, deepest first: a user's check takes in its team's and its org's
// of the same metric; a team's takes in its org's. It sets each check's group.
func pathGroups(cs []pathCheck) []group {
	var orderBuf [16]int
	order := orderBuf[:0]
	if len(cs) > len(orderBuf) {
		order = make([]int, 0, len(cs))
	}
	order = order[:len(cs)]
	for i := range order {
		order[i] = i
	}
	depth := func(r quota.Request) int {
		switch {
		case r.User != "":
			return 2
		case r.Team != "":
			return 1
		}
		return 0
	}
	slices.SortStableFunc(order, func(a, b int) int { return depth(cs[b].req) - depth(cs[a].req) })
	var gs []group
	for _, i := range order {
		if cs[i].err != nil {
			continue
		}
		r := cs[i].req
		gi := slices.IndexFunc(gs, func(g group) bool {
			return g.req.Org == r.Org && g.req.Metric == r.Metric &&
				(r.Team == "" || r.Team == g.req.Team) && (r.User == "" || r.User == g.req.User)
		})
		if gi < 0 {
			gs = append(gs, group{path: cs[i].path, first: i})
			gi = len(gs) - 1
		} else {
			gs[gi].req.Cost = max(gs[gi].req.Cost, r.Cost)
		}
		cs[i].group = gi
	}
	return mergeMetrics(cs, gs)
}

// mergeMetrics makes the groups of one path (org, team and user the same) that differ
// only in metric one multi-metric group, decided in one run all or nothing, however
// many metrics it names (CheckPaths refuses one of more than quota.MaxMetrics). It
// renumbers cs's groups.
func mergeMetrics(cs []pathCheck, gs []group) []group {
	var intoBuf [16]int
	into := intoBuf[:0]
	if len(gs) > len(intoBuf) {
		into = make([]int, 0, len(gs))
	}
	into = into[:len(gs)]
	out := gs[:0] // in place: out[k] is written after gs[k] was read (k <= i)
	for i, g := range gs {
		r := g.req
		j := slices.IndexFunc(out, func(o group) bool {
			return o.req.Org == r.Org && o.req.Team == r.Team && o.req.User == r.User && o.route == g.route
		})
		if j < 0 {
			out = append(out, g)
			into[i] = len(out) - 1
			continue
		}
		out[j].req.More = append(out[j].req.More, quota.MetricCost{Metric: r.Metric, Cost: r.Cost, Limits: r.Limits})
		out[j].req.Capacities = append(out[j].req.Capacities[:len(out[j].req.Capacities):len(out[j].req.Capacities)], r.Capacities...)
		into[i] = j
	}
	for i := range cs {
		if cs[i].group >= 0 {
			cs[i].group = into[cs[i].group]
		}
	}
	return out
}

// decidePaths has the engine decide the groups not refused, in one Decide. A group the
// engine refuses for a fault of its own (InputFault) is refused; any other error
// fails the call.
func (s *Service) decidePaths(ctx context.Context, gs []group) error {
	var liveBuf [16]int
	live := liveBuf[:0]
	for i, g := range gs {
		if g.err == nil {
			live = append(live, i)
		}
	}
	b := newBatch(len(live))
	defer b.done()
	for _, i := range live {
		b.checks = append(b.checks, quota.Check{Route: gs[i].route, Request: gs[i].req})
	}
	s.ask(ctx, b.checks)
	for j, i := range live {
		qc := &b.checks[j]
		if qc.Err != nil {
			if !InputFault(qc.Err) {
				return qc.Err
			}
			gs[i].err = qc.Err
			continue
		}
		gs[i].res, gs[i].oc = qc.Result, qc.Outcome
	}
	return nil
}

// describePaths describes each input by its path's result, and the whole.
func describePaths(cs []pathCheck, gs []group, now time.Time) Paths {
	out := Paths{Allowed: true, Checks: make([]PathCheck, len(cs))}
	var scratch [16]vocab.LevelStatus // levelsOf's, reused: tightest keeps a copy
	for i, c := range cs {
		if c.err == nil && gs[c.group].err != nil {
			c.err = gs[c.group].err
		}
		if c.err != nil {
			out.Checks[i] = PathCheck{Metric: c.req.Metric, Err: c.err}
			out.Refused++
			continue
		}
		g := gs[c.group]
		pc := PathCheck{Metric: c.req.Metric, Allowed: g.res.Allowed}
		pc.RateLimit, pc.HasRateLimit = tightest(levelsOf(g.res, c.req, len(g.req.More) > 0, scratch[:0]), now, c.req.Metric)
		out.Checks[i] = pc
	}
	// The whole is described by the first denied path, else the tightest of all.
	all := vocab.Result{Allowed: true}
	for _, g := range gs {
		if g.err != nil {
			continue
		}
		start := len(out.Levels)
		out.Levels = append(out.Levels, g.res.Levels...) // copies: a leased result's levels are shared
		for i := start; i < len(out.Levels); i++ {
			if out.Levels[i].Metric == "" {
				out.Levels[i].Metric = g.req.Metric
			}
		}
		if !g.res.Allowed && out.Allowed {
			all = g.res
			all.Levels = out.Levels[start:]
			out.Allowed = false
			if b := g.res.BlockedAt; b != nil {
				out.Violated = PolicyName(cmp.Or(b.Metric, g.req.Metric), b.Level, b.Window)
			}
		}
	}
	if out.Allowed {
		all.Levels = out.Levels
	}
	out.RateLimit, out.HasRateLimit = tightest(all, now, "")
	if !all.Allowed {
		out.RetryAfter = retryAfterSeconds(all)
	}
	for _, g := range gs {
		if g.err != nil {
			continue
		}
		if w := warning(g.res, g.mode); w != "" {
			out.Warning = w
			break
		}
	}
	for _, g := range gs {
		if g.oc.Degraded {
			out.Degraded = true
			break
		}
	}
	return out
}

// levelsOf is the part of a path's result that an input names: its own level and
// those above it. A team's check merged into a user's path is described by the
// team's and org's limits, not the user's.
// A multi-metric path's input is described by its own metric's limits. The levels
// are appended to buf.
func levelsOf(res vocab.Result, req quota.Request, multi bool, buf []vocab.LevelStatus) vocab.Result {
	if req.User != "" && !multi {
		return res
	}
	out := res
	out.Levels = buf[:0]
	for _, l := range res.Levels {
		if multi && l.Metric != req.Metric {
			continue
		}
		if l.Level == vocab.LevelOrg || (l.Level == vocab.LevelTeam && req.Team != "") || req.User != "" {
			out.Levels = append(out.Levels, l)
		}
	}
	return out
}
