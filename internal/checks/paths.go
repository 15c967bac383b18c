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
	// Allowed is false when some path was denied. RateLimit describes the first denied
	// path, else the tightest level of all (when HasRateLimit); RetryAfter is the
	// denied path's, in whole seconds.
	Allowed      bool
	RateLimit    RateLimit
	HasRateLimit bool
	RetryAfter   int64
	// Levels is every limit of the paths, each metric named, for the RateLimit-Policy
	// field (PolicyField); Violated names the limit that denied the first denied path.
	Levels   []quota.LevelStatus
	Violated string
	// Warning is the first warning of a warn-mode path; Degraded whether some path
	// was decided by its fail mode.
	Warning  string
	Degraded bool
}

// PathCheck describes one input of CheckPaths: whether its path was allowed, and
// (when HasRateLimit) its tightest limit.
type PathCheck struct {
	Metric       string
	Allowed      bool
	RateLimit    RateLimit
	HasRateLimit bool
}

// InputError says which input of CheckPaths was refused.
type InputError struct {
	Index int
	Err   error
}

func (e *InputError) Error() string { return fmt.Sprintf("input %d: %v", e.Index, e.Err) }

// Unwrap returns the refusal, which carries the kind.
func (e *InputError) Unwrap() error { return e.Err }

// pathCheck is one input's check, resolved.
type pathCheck struct {
	req   quota.Request
	route vocab.Route
	mode  vocab.Mode
	group int     // index of its path's group
	price pricing // its org's rates and its path's spend limits (money.go)
}

// group is one path: the deepest of its inputs' requests, decided once.
type group struct {
	req   quota.Request
	route vocab.Route
	mode  vocab.Mode
	res   quota.Result
	oc    quota.Outcome
	price pricing
	first int // the index of its first input
}

// CheckPaths decides several checks the way Envoy's descriptors ask for them: the
// checks that lie on one org -> team -> user path of one metric are decided as one
// atomic check (the deepest), counted once with the largest of their costs; paths that
// end at the same org, team and user and differ only in metric are one multi-metric
// check, all or nothing; checks on different paths are each decided on their own, in
// one pipelined batch. A refused
// input fails the whole call with an *InputError naming it, before anything is
// counted; an engine error fails it too. Errors carry Check's kinds.
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
		req, route, org, _, p, err := s.resolve(ctx, c, in, &slab)
		if err != nil {
			return Paths{}, &InputError{Index: i, Err: err}
		}
		cs[i] = pathCheck{req: req, route: route, mode: org.Org.Mode, price: p}
	}
	gs := pathGroups(cs)
	for i := range gs { // a path's spend is priced once, from its merged costs
		if err := price(&gs[i].req, gs[i].price); err != nil {
			return Paths{}, &InputError{Index: gs[i].first, Err: err}
		}
	}
	if err := s.decide(ctx, gs); err != nil {
		return Paths{}, err
	}
	return describePaths(cs, gs, now(s.engine, cs[0].route)), nil
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
		r := cs[i].req
		gi := slices.IndexFunc(gs, func(g group) bool {
			return g.req.Org == r.Org && g.req.Metric == r.Metric &&
				(r.Team == "" || r.Team == g.req.Team) && (r.User == "" || r.User == g.req.User)
		})
		if gi < 0 {
			gs = append(gs, group{req: r, route: cs[i].route, mode: cs[i].mode, price: cs[i].price, first: i})
			gi = len(gs) - 1
		} else {
			gs[gi].req.Cost = max(gs[gi].req.Cost, r.Cost)
		}
		cs[i].group = gi
	}
	return mergeMetrics(cs, gs)
}

// mergeMetrics makes the groups of one path (org, team and user the same) that differ
// only in metric one multi-metric group, decided in one run all or nothing (at most
// quota.MaxMetrics metrics a group; more start another). It renumbers cs's groups.
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
			return o.req.Org == r.Org && o.req.Team == r.Team && o.req.User == r.User && o.route == g.route &&
				len(o.req.More)+1 < quota.MaxMetrics
		})
		if j < 0 {
			out = append(out, g)
			into[i] = len(out) - 1
			continue
		}
		out[j].req.More = append(out[j].req.More, quota.MetricCost{Metric: r.Metric, Cost: r.Cost, Limits: r.Limits})
		into[i] = j
	}
	for i := range cs {
		cs[i].group = into[cs[i].group]
	}
	return out
}

// decide runs the groups' checks: one check, or one pipelined batch.
func (s *Service) decide(ctx context.Context, gs []group) error {
	if len(gs) == 1 {
		res, oc, err := s.engine.Check(ctx, gs[0].route, gs[0].req)
		if err != nil {
			return engineError(err)
		}
		gs[0].res, gs[0].oc = res, oc
		return nil
	}
	routes := make([]vocab.Route, len(gs))
	reqs := make([]quota.Request, len(gs))
	for i, g := range gs {
		routes[i], reqs[i] = g.route, g.req
	}
	results, outcomes, errs := s.engine.CheckBatch(ctx, routes, reqs)
	for i := range gs {
		if errs[i] != nil {
			return engineError(errs[i])
		}
		gs[i].res, gs[i].oc = results[i], outcomes[i]
	}
	return nil
}

// describePaths describes each input by its path's result, and the whole.
func describePaths(cs []pathCheck, gs []group, now time.Time) Paths {
	out := Paths{Allowed: true, Checks: make([]PathCheck, len(cs))}
	var scratch [16]quota.LevelStatus // levelsOf's, reused: tightest keeps a copy
	for i, c := range cs {
		g := gs[c.group]
		pc := PathCheck{Metric: c.req.Metric, Allowed: g.res.Allowed}
		pc.RateLimit, pc.HasRateLimit = tightest(levelsOf(g.res, c.req, len(g.req.More) > 0, scratch[:0]), now, c.req.Metric)
		out.Checks[i] = pc
	}
	// The whole is described by the first denied path, else the tightest of all.
	all := quota.Result{Allowed: true}
	for _, g := range gs {
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
func levelsOf(res quota.Result, req quota.Request, multi bool, buf []quota.LevelStatus) quota.Result {
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
