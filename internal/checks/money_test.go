package checks_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// spendOf is the derived spend of a request (its cost, its limits) and whether it has one.
func spendOf(r quota.Request) (quota.MetricCost, bool) {
	i := slices.IndexFunc(r.More, func(m quota.MetricCost) bool { return m.Metric == tenants.SpendMetric && m.Derived })
	if i < 0 {
		return quota.MetricCost{}, false
	}
	return r.More[i], true
}

// A check of a metric its org's rates price spends ceil(sum of cost x price / per)
// micro-units, as one more (derived) metric of the same decision, under the spend
// limits of its org, team and user; spend named beside priced metrics, and a spend
// past vocab.MaxUnits, are refused naming the field. shop's rates: tokens.in 2.50,
// tokens.cached 1.25, tokens.out 10, per million.
func TestCheckPrices(t *testing.T) {
	w := newWorld(t)
	shopSpend := limits(vocab.Month, 100000)
	engSpend := limits(vocab.Month, 20000)
	for _, tc := range []struct {
		name   string
		in     checks.Input
		said   string // as the engine was asked
		spend  lvls   // the spend's limits, when priced
		multi  bool
		refuse *refusal
	}{
		{name: "3000 tokens.in at 2.50 per million", in: in("shop", "eng", "", "tokens.in", 3000),
			said: "eng/ spend*:7500 tokens.in:3000", spend: lvls{shopSpend, engSpend, nil}, multi: true},
		{name: "part of a micro-unit: rounded up", in: in("shop", "", "", "tokens.in", 1),
			said: "/ spend*:3 tokens.in:1", spend: lvls{org: shopSpend}, multi: true},
		{name: "several priced: the ceiling of the exact sum", in: costs("shop", "eng", "", map[string]int64{"tokens.in": 1, "tokens.cached": 2}),
			said: "eng/ spend*:5 tokens.cached:2 tokens.in:1", spend: lvls{shopSpend, engSpend, nil}, multi: true},
		{name: "several priced: one ceiling of a fraction", in: costs("shop", "", "", map[string]int64{"tokens.in": 1, "tokens.cached": 1}),
			said: "/ spend*:4 tokens.cached:1 tokens.in:1", spend: lvls{org: shopSpend}, multi: true},
		{name: "in and out", in: costs("shop", "eng", "", map[string]int64{"tokens.in": 3000, "tokens.out": 1001}),
			said: "eng/ spend*:17510 tokens.in:3000 tokens.out:1001", spend: lvls{shopSpend, engSpend, nil}, multi: true},
		{name: "priced beside unpriced", in: costs("shop", "eng", "", map[string]int64{"requests": 1, "tokens.out": 1001}),
			said: "eng/ requests:1 spend*:10010 tokens.out:1001", spend: lvls{shopSpend, engSpend, nil}, multi: true},
		{name: "a query spends nothing", in: in("shop", "eng", "", "tokens.in", 0),
			said: "eng/ spend*:0 tokens.in:0", spend: lvls{shopSpend, engSpend, nil}, multi: true},
		{name: "a registered user's own budget", in: in("shop", "", "dave", "tokens.in", 100),
			said: "eng/dave spend*:250 tokens.in:100", spend: lvls{shopSpend, engSpend, limits(vocab.Month, 3000)}, multi: true},
		{name: "an unregistered user's team default budget", in: in("shop", "eng", "eve", "tokens.out", 7),
			said: "eng/eve spend*:70 tokens.out:7", spend: lvls{shopSpend, engSpend, limits(vocab.Month, 4000)}, multi: true},
		{name: "at the bound", in: in("shop", "", "", "tokens.out", vocab.MaxUnits/10),
			said: fmt.Sprintf("/ spend*:%d tokens.out:%d", vocab.MaxUnits/10*10, vocab.MaxUnits/10), spend: lvls{org: shopSpend}, multi: true},
		{name: "an unpriced metric spends nothing", in: in("shop", "eng", "", "", -1), said: "eng/ requests:1"},
		{name: "spend named alone is given, not priced", in: in("shop", "eng", "", tenants.SpendMetric, 700), said: "eng/ spend:700"},
		{name: "spend beside a priced metric", in: costs("shop", "eng", "", map[string]int64{"tokens.in": 1, tenants.SpendMetric: 5}),
			refuse: &refusal{derrors.Invalid, "costs", "spend is priced"}},
		{name: "a spend past the bound", in: in("shop", "eng", "", "tokens.out", vocab.MaxUnits),
			refuse: &refusal{derrors.Invalid, "cost", "micro-units"}},
		{name: "a spend of several past the bound", in: costs("shop", "eng", "", map[string]int64{"tokens.in": 1, "tokens.out": vocab.MaxUnits}),
			refuse: &refusal{derrors.Invalid, "costs", "micro-units"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			d, err := s.Check(context.Background(), shopKey, tc.in)
			if tc.refuse != nil {
				if why := tc.refuse.is(err); why != "" || len(f.calls) != 0 {
					t.Errorf("Check: %v (%d asked): %s", err, len(f.calls), why)
				}
				return
			}
			if err != nil {
				t.Fatalf("Check: %v", err)
			}
			cs := f.asked()
			if len(cs) != 1 || said(cs[0]) != tc.said {
				t.Fatalf("asked %v, want %q", cs, tc.said)
			}
			if sp, ok := spendOf(cs[0].Request); ok {
				checkLevels(t, "spend", sp.Limits, tc.spend)
			}
			if d.Multi != tc.multi {
				t.Errorf("Multi %v, want %v", d.Multi, tc.multi)
			}
		})
	}
}

// CheckPaths prices each path once its inputs are merged: from the largest cost of
// each metric on it, one ceiling for all its metrics, with the spend limits of its
// deepest input; a path whose pricing is refused is refused alone.
func TestCheckPathsPrices(t *testing.T) {
	w := newWorld(t)
	for _, tc := range []struct {
		name    string
		ins     []checks.Input
		asked   []string
		refused []int
	}{
		{name: "one path of three metrics",
			ins:   []checks.Input{in("shop", "eng", "", "tokens.in", 3000), in("shop", "eng", "", "tokens.out", 1001), in("shop", "eng", "", "", 1)},
			asked: []string{"eng/ requests:1 spend*:17510 tokens.in:3000 tokens.out:1001"}},
		{name: "a metric on one path: priced at its largest cost, once",
			ins:   []checks.Input{in("shop", "eng", "", "tokens.in", 3000), in("shop", "eng", "dave", "tokens.in", 1000)},
			asked: []string{"eng/dave spend*:7500 tokens.in:3000"}},
		{name: "two metrics at a fraction each: one ceiling",
			ins:   []checks.Input{in("shop", "eng", "", "tokens.in", 1), in("shop", "eng", "", "tokens.cached", 2)},
			asked: []string{"eng/ spend*:5 tokens.cached:2 tokens.in:1"}},
		{name: "two paths, each priced",
			ins:   []checks.Input{in("shop", "eng", "", "tokens.in", 1000), in("shop", "eng", "dave", "tokens.out", 10)},
			asked: []string{"eng/ spend*:2500 tokens.in:1000", "eng/dave spend*:100 tokens.out:10"}},
		{name: "spend named on a priced path: the path refused",
			ins:     []checks.Input{in("shop", "eng", "", "tokens.in", 1), in("shop", "eng", "", tenants.SpendMetric, 5), in("shop", "eng", "dave", "", 1)},
			asked:   []string{"eng/dave requests:1"},
			refused: []int{0, 1}},
		{name: "a path's spend past the bound: the path refused",
			ins:     []checks.Input{in("shop", "eng", "", "tokens.out", vocab.MaxUnits), in("shop", "eng", "", "tokens.in", 1), in("shop", "", "dave", "", 1)},
			asked:   []string{"eng/dave requests:1"},
			refused: []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			p, err := s.CheckPaths(context.Background(), shopKey, tc.ins)
			if err != nil {
				t.Fatalf("CheckPaths: %v", err)
			}
			if got := saidAll(t, f); fmt.Sprint(got) != fmt.Sprint(tc.asked) {
				t.Errorf("asked %q, want %q", got, tc.asked)
			}
			for i, c := range p.Checks {
				refused := slices.Contains(tc.refused, i)
				if (c.Err != nil) != refused || (refused && derrors.KindOf(c.Err) != derrors.Invalid) {
					t.Errorf("input %d: %v, want refused %v", i, c.Err, refused)
				}
			}
			if p.Refused != len(tc.refused) {
				t.Errorf("refused %d, want %d", p.Refused, len(tc.refused))
			}
		})
	}
}

// A priced reservation holds the price of its amounts, and its commit settles spend
// to the price of used at the org's rates (reading the reservation first); spend named
// in used of a priced one is refused; one that holds spend given (no priced metric)
// commits used as given; an org without rates commits without the read.
func TestReservationsPriced(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		caller  checks.Caller
		reserve checks.ReserveInput
		held    string // the request reserved, as the engine was asked
		used    any    // int64: Commit; map: CommitUsed
		ops     []string
		commit  map[string]int64 // what the engine was asked to count; nil: Commit's used as given
		refuse  *refusal
	}{
		{name: "one priced metric", caller: shopKey, reserve: checks.ReserveInput{Check: in("shop", "eng", "", "tokens.in", -1), Amount: 4000},
			held: "eng/ spend*:10000 tokens.in:4000", used: int64(1000),
			ops: []string{"reservation", "commitUsed"}, commit: map[string]int64{"tokens.in": 1000, tenants.SpendMetric: 2500}},
		{name: "several priced metrics, one left out", caller: shopKey,
			reserve: checks.ReserveInput{Check: in("shop", "eng", "", "", -1), Amounts: map[string]int64{"tokens.in": 4000, "tokens.out": 100}},
			held:    "eng/ spend*:11000 tokens.in:4000 tokens.out:100", used: map[string]int64{"tokens.in": 1001},
			ops: []string{"reservation", "commitUsed"}, commit: map[string]int64{"tokens.in": 1001, tenants.SpendMetric: 2503}},
		{name: "spend named in a priced commit", caller: shopKey, reserve: checks.ReserveInput{Check: in("shop", "eng", "", "tokens.in", -1), Amount: 4000},
			held: "eng/ spend*:10000 tokens.in:4000", used: map[string]int64{"tokens.in": 1000, tenants.SpendMetric: 1},
			ops: []string{"reservation"}, refuse: &refusal{derrors.Invalid, "used", "spend is priced"}},
		{name: "a used past the bound of spend", caller: shopKey, reserve: checks.ReserveInput{Check: in("shop", "eng", "", "tokens.out", -1), Amount: 10},
			held: "eng/ spend*:100 tokens.out:10", used: vocab.MaxUnits,
			ops: []string{"reservation"}, refuse: &refusal{derrors.Invalid, "used", "micro-units"}},
		{name: "spend given: committed as given", caller: shopKey,
			reserve: checks.ReserveInput{Check: in("shop", "eng", "", "", -1), Amounts: map[string]int64{"requests": 1, tenants.SpendMetric: 700}},
			held:    "eng/ requests:1 spend:700", used: map[string]int64{"requests": 1, tenants.SpendMetric: 650},
			ops: []string{"reservation", "commitUsed"}, commit: map[string]int64{"requests": 1, tenants.SpendMetric: 650}},
		{name: "an unpriced metric of a priced org", caller: shopKey, reserve: checks.ReserveInput{Check: in("shop", "eng", "", "", -1), Amount: 3},
			held: "eng/ requests:3", used: int64(2), ops: []string{"reservation", "commit"}},
		{name: "an org without rates: no read", caller: acmeKey, reserve: checks.ReserveInput{Check: in("acme", "eng", "", "", -1), Amount: 3},
			held: "eng/ requests:3", used: int64(2), ops: []string{"commit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, f := w.service()
			r, err := s.Reserve(ctx, tc.caller, tc.reserve)
			if err != nil {
				t.Fatalf("Reserve: %v", err)
			}
			if got := saidReq(f.reserved[0]); got != tc.held {
				t.Errorf("reserved %q, want %q", got, tc.held)
			}
			switch u := tc.used.(type) {
			case int64:
				_, err = s.Commit(ctx, tc.caller, r.Reservation.ID, u)
			case map[string]int64:
				_, err = s.CommitUsed(ctx, tc.caller, r.Reservation.ID, u)
			}
			if tc.refuse != nil {
				if why := tc.refuse.is(err); why != "" {
					t.Errorf("commit: %v: %s", err, why)
				}
			} else if err != nil {
				t.Fatalf("commit: %v", err)
			}
			if got := f.opNames(); fmt.Sprint(got) != fmt.Sprint(tc.ops) {
				t.Fatalf("engine calls %v, want %v", got, tc.ops)
			}
			last := f.ops[len(f.ops)-1]
			switch {
			case tc.commit != nil && fmt.Sprint(last.usedBy) != fmt.Sprint(tc.commit):
				t.Errorf("committed %v, want %v", last.usedBy, tc.commit)
			case tc.commit == nil && last.name == "commit" && last.used != tc.used.(int64):
				t.Errorf("committed %d, want %d", last.used, tc.used)
			}
		})
	}
}
