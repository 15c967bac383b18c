package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// Money: rates, spend budgets at every level, over real Redis and Postgres.

// moneySetup makes, through r's API, plan "llm" (USD; tokens.big at 3.00 per 7 units,
// which rounds, and tokens.small at 0.000002 per unit; requests unpriced; an org
// budget of orgBudget micro-units a month and 1000000 requests), org acme on it,
// team eng (teamBudget), users alice and bob in eng (userBudget each) and team ops
// with no budget. It returns a check key and an admin key.
func moneySetup(t *testing.T, r *replica, orgBudget, teamBudget, userBudget int64) (string, string) {
	t.Helper()
	r.mustDo("POST", "/v1/plans", operatorToken, fmt.Sprintf(`{"id":"llm","name":"LLM","fail_mode":"closed","currency":"USD",
		"rates":[{"metric":"tokens.big","price":"3.00","per":7},{"metric":"tokens.small","price":"0.000002","per":1}],
		"limits":[{"metric":"requests","window":"month","limit":1000000},{"metric":"spend","window":"month","limit":%d}]}`, orgBudget), 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"Acme","plan":"llm"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, fmt.Sprintf(`{"id":"eng","name":"Eng","limits":[{"metric":"spend","window":"month","limit":%d}]}`, teamBudget), 201)
	for _, u := range []string{"alice", "bob"} {
		r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, fmt.Sprintf(`{"id":"%s","limits":[{"metric":"spend","window":"month","limit":%d}]}`, u, userBudget), 201)
	}
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"ops","name":"Ops"}`, 201)
	return keyOf(r, "acme", `["check"]`), keyOf(r, "acme", `["admin"]`)
}

// bigPrice is the spend of n tokens.big at 3.00 per 7: ceil(n x 3000000 / 7).
func bigPrice(n int64) int64 { return (n*3_000_000 + 6) / 7 }

// spendUsed is the spend used at level (and id) in a check's answer; -1 when absent.
func spendUsed(res api.CheckResult, level string) int64 {
	for _, l := range res.Levels {
		if l.Metric != nil && *l.Metric == "spend" && string(l.Level) == level && l.Window == "month" {
			return l.Used
		}
	}
	return -1
}

// A check refused by a money budget at any one level (user, team, org) counts
// nothing anywhere, neither units nor spend, and names spend and the level; a
// requests+tokens check is refused by alice's budget while every unit limit has room.
func TestMoneyBudgetRefusalCountsNothing(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	// org 10.00 USD, eng 5.00 USD, alice and bob 2.00 USD each
	key, admin := moneySetup(t, r.replica, 10_000_000, 5_000_000, 2_000_000)

	// 4 tokens.big: ceil(12/7 USD) = 1714286 micro-units, at every level
	ok := r.check(key, `{"org":"acme","user":"alice","costs":{"requests":1,"tokens.big":4}}`)
	if ok.code != 200 || spendUsed(ok.body, "user") != bigPrice(4) || spendUsed(ok.body, "team") != bigPrice(4) || spendUsed(ok.body, "org") != bigPrice(4) {
		t.Fatalf("priced check = %d %s, want spend %d at every level", ok.code, ok.raw, bigPrice(4))
	}
	for _, tc := range []struct {
		name, body, level string
	}{
		// alice has 285714 left: one more tokens.big (428572) does not fit
		{"user", `{"org":"acme","user":"alice","costs":{"requests":1,"tokens.big":1}}`, "user"},
		// bob's own 2.00 fits 4 tokens.big; eng has 5.00 - 1.714286 = 3.285714 left, not 8 tokens (3428572)
		{"team", `{"org":"acme","team":"eng","costs":{"requests":1,"tokens.big":8}}`, "team"},
		// ops has no budget; the org has 10.00 - 1.714286 left, not 20 tokens (8571429)
		{"org", `{"org":"acme","team":"ops","costs":{"requests":1,"tokens.big":20}}`, "org"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := usageOf(t, r, admin)
			got := r.check(key, tc.body)
			if got.code != 429 || got.body.BlockedAt == nil || got.body.BlockedAt.Metric == nil || *got.body.BlockedAt.Metric != "spend" ||
				string(got.body.BlockedAt.Level) != tc.level {
				t.Fatalf("check = %d %s, want 429 blocked at spend %s", got.code, got.raw, tc.level)
			}
			if after := usageOf(t, r, admin); after != before {
				t.Fatalf("a check refused by the %s's money budget counted:\nbefore %s\nafter  %s", tc.level, before, after)
			}
		})
	}
	// A single-metric priced check spends too, and tokens.small's 0.000002 a token is exact.
	got := r.check(key, `{"org":"acme","user":"bob","metric":"tokens.small","cost":250000}`)
	if got.code != 200 || spendUsed(got.body, "user") != 500_000 {
		t.Fatalf("tokens.small check = %d %s, want bob's spend 500000", got.code, got.raw)
	}
	// Spend is priced, never given beside priced metrics.
	if bad := r.check(key, `{"org":"acme","costs":{"tokens.big":1,"spend":5}}`); bad.code != 400 || !strings.Contains(bad.raw, "spend is priced") {
		t.Fatalf("spend named beside a priced metric = %d %s, want 400", bad.code, bad.raw)
	}

	// A spend above 2^50 micro-units in one decision is refused, naming the cost.
	r.mustDo("PUT", "/v1/orgs/acme/rates", operatorToken, `{"rates":[{"metric":"tokens.small","price":"1125899906.842624","per":1}]}`, 200)
	waitFor(t, func() bool {
		huge := r.check(key, `{"org":"acme","team":"ops","metric":"tokens.small","cost":2}`)
		return huge.code == 400 && strings.Contains(huge.raw, `"cost"`) && strings.Contains(huge.raw, "micro-units of spend")
	})

	// warn and shadow: over the budget, allowed and counted, the warning names spend.
	r.mustDo("PATCH", "/v1/orgs/acme", operatorToken, `{"mode":"warn"}`, 200)
	waitFor(t, func() bool {
		w := r.check(key, `{"org":"acme","user":"alice","costs":{"requests":1,"tokens.big":1}}`)
		if w.code == 200 && w.body.Warning != nil && strings.Contains(*w.body.Warning, "user") && spendUsed(w.body, "user") > 2_000_000 {
			return true
		}
		if w.code != 429 {
			t.Fatalf("warn-mode check over alice's budget = %d %s", w.code, w.raw)
		}
		return false
	})
}

// waitFor polls cond every 5 ms for at most 2 seconds.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 2s")
		}
	}
}

// 64 concurrent priced checks over 2 replicas (two handlers, caches and engines on
// one Redis and one Postgres) never pass any level's budget, and the spend counted
// at every level is exactly the sum of the admitted checks' prices, in integer
// micro-units.
func TestMoneyConcurrentOverTwoReplicas(t *testing.T) {
	dbURL, prefix := testenv.PostgresURL(t), testenv.ID(t, "h")
	a, b := newReplica(t, dbURL, prefix), newReplica(t, dbURL, prefix)
	const orgBudget, teamBudget, userBudget = 75_000_000, 70_000_000, 35_000_000
	key, _ := moneySetup(t, a, orgBudget, teamBudget, userBudget)

	var mu sync.Mutex
	admitted := map[string]int64{} // spend admitted per user
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, user := a, "alice"
			if g%2 == 1 {
				rep = b
			}
			if g%4 >= 2 {
				user = "bob"
			}
			for i := range 4 {
				n := int64(1 + (g+i)%5) // 1..5 tokens.big, each price rounded up on its own
				got := rep.check(key, fmt.Sprintf(`{"org":"acme","user":"%s","costs":{"requests":1,"tokens.big":%d}}`, user, n))
				switch got.code {
				case 200:
					allowed.Add(1)
					mu.Lock()
					admitted[user] += bigPrice(n)
					mu.Unlock()
				case 429:
					denied.Add(1)
				default:
					t.Errorf("check = %d %s", got.code, got.raw)
				}
			}
		}()
	}
	wg.Wait()
	final := a.check(key, `{"org":"acme","user":"alice","costs":{"tokens.big":0}}`)
	bobs := b.check(key, `{"org":"acme","user":"bob","costs":{"tokens.big":0}}`)
	sum := admitted["alice"] + admitted["bob"]
	t.Logf("%d admitted, %d refused; spent %d micro-units (alice %d, bob %d)", allowed.Load(), denied.Load(), sum, admitted["alice"], admitted["bob"])
	if denied.Load() == 0 {
		t.Fatal("no check was refused: the budgets were not tested")
	}
	for _, c := range []struct {
		name      string
		got, want int64
		budget    int64
	}{
		{"alice", spendUsed(final.body, "user"), admitted["alice"], userBudget},
		{"bob", spendUsed(bobs.body, "user"), admitted["bob"], userBudget},
		{"team eng", spendUsed(final.body, "team"), sum, teamBudget},
		{"org acme", spendUsed(final.body, "org"), sum, orgBudget},
	} {
		if c.got != c.want || c.got > c.budget {
			t.Errorf("%s spent %d, want exactly %d (the admitted checks' prices), at most its budget %d", c.name, c.got, c.want, c.budget)
		}
	}
}

// A rate change made through one replica prices every later decision at the new
// rate on both replicas within a second (the plan's rates and an org override).
func TestRateChangeReachesEveryReplica(t *testing.T) {
	dbURL, prefix := testenv.PostgresURL(t), testenv.ID(t, "h")
	a, b := newReplica(t, dbURL, prefix), newReplica(t, dbURL, prefix)
	key, _ := moneySetup(t, a, 1_000_000_000, 1_000_000_000, 500_000_000)
	const body = `{"org":"acme","user":"alice","costs":{"requests":1,"tokens.small":1000}}`
	last := int64(0)
	spendOf := func(r *replica) int64 { // the spend of one check on r, from alice's counter
		t.Helper()
		got := r.check(key, body)
		if got.code != 200 {
			t.Fatalf("check = %d %s", got.code, got.raw)
		}
		used := spendUsed(got.body, "user")
		d := used - last
		last = used
		return d
	}
	if d := spendOf(b); d != 2000 {
		t.Fatalf("spend before the change = %d, want 2000 (1000 x 0.000002 USD)", d)
	}
	// an idempotent check, repeated after the rate changes below: still a repeat
	const idem = `{"org":"acme","user":"bob","costs":{"tokens.small":10},"idempotency_key":"money-retry-1"}`
	if got := a.check(key, idem); got.code != 200 {
		t.Fatalf("idempotent check = %d %s", got.code, got.raw)
	}
	for _, change := range []struct {
		name, method, path, body string
		want                     int64
	}{
		{"plan", "PATCH", "/v1/plans/llm", `{"rates":[{"metric":"tokens.big","price":"3","per":7},{"metric":"tokens.small","price":"0.000005","per":1}]}`, 5000},
		{"org override", "PUT", "/v1/orgs/acme/rates", `{"rates":[{"metric":"tokens.small","price":"0.011","per":1000}]}`, 11000},
	} {
		start := time.Now()
		a.mustDo(change.method, change.path, operatorToken, change.body, 200)
		for d := spendOf(b); d != change.want; d = spendOf(b) {
			if time.Since(start) > time.Second {
				t.Fatalf("%s: replica b still prices at %d a check after 1s, want %d", change.name, d, change.want)
			}
			time.Sleep(2 * time.Millisecond)
		}
		t.Logf("%s: replica b priced at the new rate after %v", change.name, time.Since(start))
		for i := range 10 { // every later decision, on either replica
			r := map[bool]*replica{true: a, false: b}[i%2 == 0]
			if d := spendOf(r); d != change.want {
				t.Fatalf("%s: decision %d after the change spent %d, want %d", change.name, i, d, change.want)
			}
		}
	}
	if got := b.check(key, idem); got.code != 200 || got.body.Replayed == nil || !*got.body.Replayed {
		t.Fatalf("the idempotent check repeated after a rate change = %d %s, want its first decision replayed", got.code, got.raw)
	}
	// a batch item is priced as a check is
	rec := b.f.do("POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","user":"bob","costs":{"tokens.small":1000}},{"org":"acme","user":"bob","metric":"tokens.small","cost":1000}]}`)
	var batch struct{ Results []api.CheckResult }
	if err := json.Unmarshal(rec.Body.Bytes(), &batch); err != nil || len(batch.Results) != 2 {
		t.Fatalf("batch = %d %s", rec.Code, rec.Body)
	}
	var bob []int64
	for _, res := range batch.Results {
		bob = append(bob, spendUsed(res, "user"))
	}
	if bob[1]-bob[0] != 11000 {
		t.Fatalf("bob's spend over the batch %v: the second item spent %d, want 11000", bob, bob[1]-bob[0])
	}
	var rc api.OrgRates
	_ = json.Unmarshal([]byte(a.mustDo("GET", "/v1/orgs/acme/rates", operatorToken, "", 200)), &rc)
	if len(rc.Overrides) != 1 || rc.Overrides[0].Price != "0.011" || len(rc.Rates) != 2 || rc.Currency == nil || *rc.Currency != "USD" {
		t.Fatalf("org rates = %+v", rc)
	}
	var audited int
	if err := a.f.pool.QueryRow(context.Background(), `SELECT count(*) FROM audit_log WHERE org_id = 'acme' AND action = 'org.rates'`).Scan(&audited); err != nil || audited != 1 {
		t.Fatalf("org.rates audit rows = %d (%v), want 1", audited, err)
	}
	// An org key may not set rates (operator only).
	admin := keyOf(a, "acme", `["admin"]`)
	if rec := a.f.do("PUT", "/v1/orgs/acme/rates", admin, `{"rates":[]}`); rec.Code != 403 {
		t.Fatalf("rates set by an org key = %d %s, want 403", rec.Code, rec.Body)
	}
}

// A reservation holds spend at its reserved amount's price and settles it to the
// price of what was used; an expired one settles at the reserved price.
func TestReservationSpendHeldAndSettled(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	key, admin := moneySetup(t, r.replica, 100_000_000, 100_000_000, 50_000_000)
	spend := func() (used, reserved int64) {
		for _, m := range r.usage(t, "acme", admin).Metrics {
			if m.Metric == "spend" {
				return m.Org.Used, m.Org.Reserved
			}
		}
		return 0, 0
	}
	code, res, raw := r.reserve(key, `{"org":"acme","user":"alice","metric":"tokens.big","amount":70}`)
	if code != 201 {
		t.Fatalf("reserve = %d %s", code, raw)
	}
	if used, held := spend(); used != 0 || held != bigPrice(70) {
		t.Fatalf("spend after reserving 70 tokens.big: used %d, held %d; want 0 and %d", used, held, bigPrice(70))
	}
	// commit 9 used (one metric, as given): spend settles to ceil(27/7 USD)
	r.mustDo("POST", "/v1/reservations/"+res.Id+"/commit", key, `{"used":9}`, 200)
	if used, held := spend(); used != bigPrice(9) || held != 0 {
		t.Fatalf("spend after committing 9: used %d, held %d; want %d and 0", used, held, bigPrice(9))
	}
	// several metrics: amounts and used per metric, spend priced from them
	code, res, raw = r.reserve(key, `{"org":"acme","user":"alice","amounts":{"requests":1,"tokens.big":7,"tokens.small":1000000}}`)
	if code != 201 {
		t.Fatalf("reserve several = %d %s", code, raw)
	}
	if _, held := spend(); held != 3_000_000+2_000_000 {
		t.Fatalf("held spend %d, want 5000000", held)
	}
	if rec := r.f.do("POST", "/v1/reservations/"+res.Id+"/commit", key, `{"used":{"spend":1}}`); rec.Code != 400 {
		t.Fatalf("commit naming spend = %d %s, want 400", rec.Code, rec.Body)
	}
	r.mustDo("POST", "/v1/reservations/"+res.Id+"/commit", key, `{"used":{"requests":1,"tokens.big":14}}`, 200)
	if used, held := spend(); used != bigPrice(9)+6_000_000 || held != 0 {
		t.Fatalf("spend after committing 14 tokens.big (over the 7 reserved): used %d, held %d; want %d and 0", used, held, bigPrice(9)+6_000_000)
	}
}

// A reservation that holds spend itself (no metric it names is priced) commits the
// spend it used in micro-units like any metric, counted exactly: with other metrics
// (used {"spend": 200, ...}) and alone (metric spend, used 200). A commit of a priced
// reservation still prices its spend from its units, and a reservation may not name
// spend beside a priced metric. Before, a commit naming spend was a 400 in a priced
// org, and one without it counted spend 0.
func TestReservationHoldingSpendCommitsItExactly(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	key, admin := moneySetup(t, r.replica, 100_000_000, 100_000_000, 50_000_000)
	spend := func() (used, reserved int64) {
		for _, m := range r.usage(t, "acme", admin).Metrics {
			if m.Metric == "spend" {
				return m.Org.Used, m.Org.Reserved
			}
		}
		return 0, 0
	}
	code, res, raw := r.reserve(key, `{"org":"acme","user":"alice","amounts":{"requests":3,"spend":500}}`)
	if code != 201 {
		t.Fatalf("reserve requests and spend = %d %s", code, raw)
	}
	if used, held := spend(); used != 0 || held != 500 {
		t.Fatalf("spend after reserving 500: used %d, held %d; want 0 and 500", used, held)
	}
	r.mustDo("POST", "/v1/reservations/"+res.Id+"/commit", key, `{"used":{"spend":200,"requests":2}}`, 200)
	if used, held := spend(); used != 200 || held != 0 {
		t.Fatalf("spend after committing 200 of 500: used %d, held %d; want 200 and 0", used, held)
	}

	// One metric, spend alone.
	code, res, raw = r.reserve(key, `{"org":"acme","user":"alice","metric":"spend","amount":500}`)
	if code != 201 {
		t.Fatalf("reserve spend = %d %s", code, raw)
	}
	r.mustDo("POST", "/v1/reservations/"+res.Id+"/commit", key, `{"used":200}`, 200)
	if used, held := spend(); used != 400 || held != 0 {
		t.Fatalf("spend after committing 200 more: used %d, held %d; want 400 and 0", used, held)
	}

	// Spend beside a priced metric is refused when reserving: spend is then priced.
	if code, _, raw := r.reserve(key, `{"org":"acme","user":"alice","amounts":{"tokens.big":7,"spend":500}}`); code != 400 || !strings.Contains(raw, "spend is priced") {
		t.Fatalf("reserve tokens.big and spend = %d %s, want 400", code, raw)
	}
	// A priced reservation's spend is still priced from what it used.
	code, res, raw = r.reserve(key, `{"org":"acme","user":"alice","amounts":{"requests":1,"tokens.big":7}}`)
	if code != 201 {
		t.Fatalf("reserve tokens.big = %d %s", code, raw)
	}
	if rec := r.f.do("POST", "/v1/reservations/"+res.Id+"/commit", key, `{"used":{"spend":1,"tokens.big":7}}`); rec.Code != 400 {
		t.Fatalf("commit of a priced reservation naming spend = %d %s, want 400", rec.Code, rec.Body)
	}
	r.mustDo("POST", "/v1/reservations/"+res.Id+"/commit", key, `{"used":{"tokens.big":7}}`, 200)
	if used, held := spend(); used != 400+3_000_000 || held != 0 {
		t.Fatalf("spend after committing 7 tokens.big: used %d, held %d; want %d and 0", used, held, 400+3_000_000)
	}
}

// Budgets are carved like any metric, and a refusal says the amounts in money.
func TestSpendAllocationInMoney(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"llm","name":"LLM","fail_mode":"closed","currency":"USD",
		"rates":[{"metric":"tokens","price":"2.50","per":1000000}],"limits":[{"metric":"spend","window":"month","limit":2000000000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"Acme","plan":"llm"}`, 201)
	for _, tc := range []struct {
		name, method, path, body, want string
	}{
		{"team above the org", "POST", "/v1/orgs/acme/teams", `{"id":"research","name":"R","limits":[{"metric":"spend","window":"month","limit":2500000000}]}`,
			`2,500.00 USD exceeds org \"acme\"'s 2,000.00 USD`},
		{"user above the team", "POST", "/v1/orgs/acme/teams/eng/users", `{"id":"ann","limits":[{"metric":"spend","window":"month","limit":150000000}]}`,
			`150.00 USD exceeds team \"eng\"'s 100.00 USD`},
		{"second team past the rest", "POST", "/v1/orgs/acme/teams", `{"id":"ops","name":"O","limits":[{"metric":"spend","window":"month","limit":1950000000}]}`,
			`1,950.00 USD exceeds the 1,900.00 USD left of org \"acme\"'s 2,000.00 USD (100.00 USD is already allocated)`},
	} {
		if tc.name == "user above the team" {
			r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"eng","name":"E","limits":[{"metric":"spend","window":"month","limit":100000000}]}`, 201)
		}
		rec := r.f.do(tc.method, tc.path, operatorToken, tc.body)
		if rec.Code != 422 || !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s = %d %s, want 422 saying %s", tc.name, rec.Code, rec.Body, tc.want)
		}
	}
}

// Rate cards are validated: problem+json naming the field, nothing written.
func TestRateCardValidation(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	for _, tc := range []struct {
		name, body, field string
	}{
		{"rates without a currency", `"rates":[{"metric":"tokens","price":"1","per":1}]`, `"currency"`},
		{"not ISO 4217", `"currency":"ABC","rates":[]`, `"currency"`},
		{"lower case", `"currency":"usd"`, `currency`},
		{"below a micro-unit", `"currency":"USD","rates":[{"metric":"tokens","price":"0.0000001","per":1}]`, `rates`},
		{"a float", `"currency":"USD","rates":[{"metric":"tokens","price":"1e-3","per":1}]`, `rates`},
		{"per 0", `"currency":"USD","rates":[{"metric":"tokens","price":"1","per":0}]`, `per`},
		{"spend priced", `"currency":"USD","rates":[{"metric":"spend","price":"1","per":1}]`, `rates[0].metric`},
		{"repeated", `"currency":"USD","rates":[{"metric":"t","price":"1","per":1},{"metric":"t","price":"2","per":1}]`, `rates[1].metric`},
		{"spend limit without a currency", `"limits":[{"metric":"spend","window":"month","limit":5}]`, `"currency"`},
	} {
		body := `{"id":"bad","name":"B","fail_mode":"closed","limits":[],` + tc.body + `}`
		if strings.Contains(tc.body, `"limits"`) {
			body = `{"id":"bad","name":"B","fail_mode":"closed",` + tc.body + `}`
		}
		rec := r.f.do("POST", "/v1/plans", operatorToken, body)
		if rec.Code != 400 || rec.Header().Get("Content-Type") != "application/problem+json" || !strings.Contains(rec.Body.String(), tc.field) {
			t.Errorf("%s: %d %s, want a 400 problem naming %s", tc.name, rec.Code, rec.Body, tc.field)
		}
	}
	if rec := r.f.do("GET", "/v1/plans/bad", operatorToken, ""); rec.Code != 404 {
		t.Fatalf("a refused plan was written: %d %s", rec.Code, rec.Body)
	}
	// an org whose plan has no currency gets no rates
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"plain","name":"P","fail_mode":"closed","limits":[]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"plain"}`, 201)
	if rec := r.f.do("PUT", "/v1/orgs/acme/rates", operatorToken, `{"rates":[{"metric":"tokens","price":"1","per":1}]}`); rec.Code != 400 || !strings.Contains(rec.Body.String(), "no currency") {
		t.Fatalf("rates for an org without a currency = %d %s", rec.Code, rec.Body)
	}
}

// Spend shows in usage as money (currency, used_amount) and in the billing export
// beside units, with the rate used.
func TestSpendInUsageAndExport(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	key, admin := moneySetup(t, r.replica, 100_000_000, 50_000_000, 20_000_000)
	for range 3 {
		if got := r.check(key, `{"org":"acme","user":"alice","costs":{"requests":1,"tokens.big":10,"tokens.small":500}}`); got.code != 200 {
			t.Fatalf("check = %d %s", got.code, got.raw)
		}
	}
	per := bigPrice(10) + 1000 // the two metrics summed exactly, rounded up once
	u := r.usage(t, "acme", admin)
	var spend *api.MetricUsage
	for i, m := range u.Metrics {
		if m.Currency != nil && m.Metric != "spend" {
			t.Errorf("metric %s carries a currency", m.Metric)
		}
		if m.Metric == "spend" {
			spend = &u.Metrics[i]
		}
	}
	if spend == nil || spend.Currency == nil || *spend.Currency != "USD" || spend.Org.Used != 3*per ||
		spend.Org.UsedAmount == nil || *spend.Org.UsedAmount != "12.860145" {
		b, _ := json.Marshal(spend)
		t.Fatalf("spend usage = %s, want USD, used %d = 12.860145", b, 3*per)
	}
	if len(spend.Users) != 1 || spend.Users[0].Limits[0].LimitAmount == nil || *spend.Users[0].Limits[0].LimitAmount != "20" {
		t.Errorf("alice's spend limit amount: %+v", spend.Users)
	}
	if _, err := r.flusher().FlushOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	csv := r.mustDo("GET", "/v1/orgs/acme/billing/export?format=csv&period="+u.Period, admin, "", 200)
	lines := strings.Split(strings.TrimSpace(csv), "\n")
	if !strings.HasPrefix(lines[0], "period,org,team,user,metric,units,") || !strings.HasSuffix(lines[0], ",spend_amount,spend_currency,rate_price,rate_per") {
		t.Fatalf("csv header %q", lines[0])
	}
	for _, want := range []string{
		u.Period + ",acme,,,spend,12860145,0,0,0,,0,12.860145,USD,,0",
		u.Period + ",acme,,,tokens.big,30,0,0,0,,0,12.857143,USD,3,7",
		u.Period + ",acme,eng,alice,tokens.small,1500,0,0,0,,0,0.003,USD,0.000002,1",
		u.Period + ",acme,,,requests,3,0,0,0,,0,,,,0",
	} {
		if !strings.Contains(csv, want+"\n") {
			t.Errorf("export lacks %q:\n%s", want, csv)
		}
	}
}

// A budget may have a shorter window than the month, like any limit: 1.00 USD a
// minute refuses the second 0.60 USD call, and a child's minute budget may not
// exceed its parent's.
func TestSpendMinuteBudget(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "h"))
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"llm","name":"LLM","fail_mode":"closed","currency":"EUR",
		"rates":[{"metric":"tokens","price":"10","per":1000000}],"limits":[{"metric":"spend","window":"minute","limit":1000000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"Acme","plan":"llm"}`, 201)
	rec := r.f.do("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"eng","name":"E","limits":[{"metric":"spend","window":"minute","limit":1500000}]}`)
	if rec.Code != 422 || !strings.Contains(rec.Body.String(), `spend/minute budget 1.50 EUR exceeds org \"acme\"'s 1.00 EUR`) {
		t.Fatalf("a team's minute budget above the org's = %d %s", rec.Code, rec.Body)
	}
	key := keyOf(r, "acme", `["check"]`)
	if got := r.check(key, `{"org":"acme","metric":"tokens","cost":60000}`); got.code != 200 {
		t.Fatalf("first call = %d %s", got.code, got.raw)
	}
	got := r.check(key, `{"org":"acme","metric":"tokens","cost":60000}`)
	if got.code != 429 || got.body.BlockedAt == nil || got.body.BlockedAt.Window != "minute" || *got.body.BlockedAt.Metric != "spend" {
		t.Fatalf("second call = %d %s, want 429 at spend/minute", got.code, got.raw)
	}
}
