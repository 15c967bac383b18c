package rls_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// usedAt reads the month usage of metric at the deepest level body names (a cost-0
// HTTP check: body without cost, metric or costs).
func (r *replica) usedAt(key, body, metric string) int64 {
	r.t.Helper()
	rec := r.do("POST", "/v1/check", key, strings.TrimSuffix(body, "}")+fmt.Sprintf(`,"metric":%q,"cost":0}`, metric))
	var res api.CheckResult
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || rec.Code != 200 && rec.Code != 429 {
		r.t.Fatalf("usage check %s = %d %s", body, rec.Code, rec.Body)
	}
	want := vocab.LevelOrg
	switch {
	case strings.Contains(body, `"user"`):
		want = vocab.LevelUser
	case strings.Contains(body, `"team"`):
		want = vocab.LevelTeam
	}
	for _, l := range res.Levels {
		if string(l.Level) == string(want) && l.Window == "month" {
			return l.Used
		}
	}
	r.t.Fatalf("no %s month level of %s in %s", want, metric, rec.Body)
	return 0
}

// maxEcho is the most characters of a value an error or a header may repeat (the
// contract's bound, ../shared/API.md).
const maxEcho = 64

// noLongRun fails when s holds more than maxEcho characters of value in a row.
func noLongRun(t *testing.T, what, s, value string) {
	t.Helper()
	if len(value) <= maxEcho {
		return
	}
	for i := 0; i+maxEcho+1 <= len(value); i += max(1, len(value)/16) {
		if run := value[i : i+maxEcho+1]; strings.Contains(s, run) {
			t.Errorf("%s echoes more than %d characters of a value (%d bytes long)", what, maxEcho, len(s))
			return
		}
	}
}

// The bootstrap of docs/ENVOY.md makes [team=<x-team-id>], [team=<x-team-id>,
// user=<x-user-id>] and [metric=requests] from the client's own headers. Whatever an
// end user puts there, the call is answered, never an error a proxy with
// failure_mode_deny: false would forward on: the descriptors that name no check are
// OVER_LIMIT for themselves, with no current_limit, counting nothing; the others are
// decided and counted as one path (the org, and the team when it is known, move by
// exactly the cost, once); the answer is OVER_LIMIT and Quotaplane-Refused says which
// descriptor and why, bounded. The same for every other kind of undecidable
// descriptor beside [team=eng] and [metric=requests].
func TestUndecidableDescriptorsAreRefusedAlone(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	r.mustDo("POST", "/v1/plans", `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":100000},{"metric":"tokens","window":"month","limit":100000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"acme","name":"O","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"other","name":"O","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", `{"id":"eng","name":"T","limits":[{"metric":"requests","window":"month","limit":5000}],"user_limits":[{"metric":"requests","window":"month","limit":1000}]}`, 201)
	key := r.key("acme", `"check"`)
	const cost = 3
	long, mb := strings.Repeat("a", 129), strings.Repeat("m", 1<<20)
	bootstrap := func(team, user string) []*ratelimitv3.RateLimitDescriptor {
		return []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", team}), desc(entry{"team", team}, entry{"user", user}), desc(entry{"metric", "requests"})}
	}
	beside := func(d *ratelimitv3.RateLimitDescriptor) []*ratelimitv3.RateLimitDescriptor {
		return []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", "eng"}), d, desc(entry{"metric", "requests"})}
	}
	override := desc(entry{"team", "eng"}, entry{"user", "alice"})
	override.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5}
	negative := desc(entry{"team", "eng"}, entry{"user", "alice"})
	negative.IsNegativeHits = true
	cases := []struct {
		name  string
		ds    []*ratelimitv3.RateLimitDescriptor
		bad   []int  // the descriptors refused
		eng   int64  // what team eng's requests move by
		why   string // in Quotaplane-Refused
		value string // a value sent that must not be echoed whole
	}{
		{"bad user", bootstrap("eng", "bad user"), []int{1}, cost, "user: ", ""},
		{"129-character user", bootstrap("eng", long), []int{1}, cost, "user: ", long},
		{"ü user", bootstrap("eng", "ü"), []int{1}, cost, "user: ", ""},
		{"empty user", bootstrap("eng", ""), []int{1}, cost, "user: ", ""},
		{"1 MB user", bootstrap("eng", mb), []int{1}, cost, "user: ", mb},
		{"unknown team", bootstrap("sales", "alice"), []int{0, 1}, 0, `team "sales" of org "acme" not found`, ""},
		{"T for t", bootstrap("ENG", "alice"), []int{0, 1}, 0, `team "ENG" of org "acme" not found`, ""},
		{"bad team", bootstrap("bad team", "alice"), []int{0, 1}, 0, "team: ", ""},
		{"129-character team", bootstrap(long, "alice"), []int{0, 1}, 0, "team: ", long},
		{"ü team", bootstrap("ü", "alice"), []int{0, 1}, 0, "team: ", ""},
		{"1 MB team", bootstrap(mb, "alice"), []int{0, 1}, 0, "team: ", mb},
		{"unknown entry key", beside(desc(entry{"path", "/x"})), []int{1}, cost, `unknown entry key "path"`, ""},
		{"1 MB entry key", beside(desc(entry{mb, "/x"})), []int{1}, cost, "unknown entry key", mb},
		{"unknown metric", beside(desc(entry{"team", "eng"}, entry{"metric", "bytes"})), []int{1}, cost, `unknown metric "bytes"`, ""},
		{"unregistered user without a team", beside(desc(entry{"user", "zed"})), []int{1}, cost, "name its team", ""},
		{"another org", beside(desc(entry{"org", "other"}, entry{"team", "eng"})), []int{1}, cost, `belongs to org "acme"`, ""},
		{"1 MB org", beside(desc(entry{"org", mb})), []int{1}, cost, `belongs to org "acme"`, mb},
		{"entry twice", beside(desc(entry{"team", "eng"}, entry{"team", "ops"})), []int{1}, cost, "given twice", ""},
		{"empty descriptor", beside(desc()), []int{1}, cost, "at least one entry", ""},
		{"limit override", beside(override), []int{1}, cost, "limit overrides are not supported", ""},
		{"is_negative_hits", beside(negative), []int{1}, cost, "is_negative_hits", ""},
		{"hits_addend past the bound", beside(withCost(desc(entry{"team", "eng"}, entry{"user", "alice"}), uint64(vocab.MaxUnits)+1)), []int{1}, cost,
			"hits_addend: must be 0 to 1125899906842624", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			org0, eng0, alice0 := r.usedAt(key, `{"org":"acme"}`, "requests"), r.usedAt(key, `{"org":"acme","team":"eng"}`, "requests"),
				r.usedAt(key, `{"org":"acme","team":"eng","user":"alice"}`, "requests")
			res, err := r.should(key, cost, c.ds...)
			if err != nil {
				t.Fatalf("ShouldRateLimit = %v, want an answer (an error lets a proxy with failure_mode_deny: false forward)", err)
			}
			if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(res.GetStatuses()) != len(c.ds) {
				t.Fatalf("overall %v with %d statuses, want OVER_LIMIT with %d", res.GetOverallCode(), len(res.GetStatuses()), len(c.ds))
			}
			for i, st := range res.GetStatuses() {
				isBad := false
				for _, b := range c.bad {
					isBad = isBad || b == i
				}
				switch {
				case isBad && (st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCurrentLimit() != nil):
					t.Errorf("descriptor %d = %v, want OVER_LIMIT without a current_limit", i, st)
				case !isBad && (st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() == nil):
					t.Errorf("descriptor %d = %v, want OK, decided", i, st)
				}
			}
			refused := headerOf(res, "Quotaplane-Refused")
			if !strings.HasPrefix(refused, fmt.Sprintf("descriptor %d (", c.bad[0])) || !strings.Contains(refused, c.why) || len(refused) > 512 {
				t.Errorf("Quotaplane-Refused = %q, want descriptor %d and %q, at most 512 bytes", refused, c.bad[0], c.why)
			}
			if headerOf(res, "Retry-After") != "" {
				t.Errorf("Retry-After %q: no wait makes a refused descriptor decidable", headerOf(res, "Retry-After"))
			}
			for _, h := range res.GetResponseHeadersToAdd() {
				noLongRun(t, h.GetKey(), h.GetValue(), c.value)
			}
			if d := r.usedAt(key, `{"org":"acme"}`, "requests") - org0; d != cost {
				t.Errorf("the org's requests moved by %d, want the cost %d, once", d, cost)
			}
			if d := r.usedAt(key, `{"org":"acme","team":"eng"}`, "requests") - eng0; d != c.eng {
				t.Errorf("team eng's requests moved by %d, want %d", d, c.eng)
			}
			if d := r.usedAt(key, `{"org":"acme","team":"eng","user":"alice"}`, "requests") - alice0; d != 0 {
				t.Errorf("alice's requests moved by %d: a refused descriptor counted", d)
			}
		})
	}
	if got := r.usedAt(key, `{"org":"acme"}`, "tokens"); got != 0 {
		t.Errorf("the org's tokens: %d, want 0", got)
	}
}

// A path is never split: 17 metrics on one path (more than the 16 a check may name)
// are refused whole, every descriptor OVER_LIMIT, counting nothing, while another
// path of the same call is decided and counted. 16 metrics on one path are one
// decision, counted.
func TestAPathOfTooManyMetricsIsRefusedWhole(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	var limits []string
	for i := range 17 {
		limits = append(limits, fmt.Sprintf(`{"metric":"m%02d","window":"month","limit":1000}`, i))
	}
	r.mustDo("POST", "/v1/plans", `{"id":"p","name":"P","fail_mode":"closed","limits":[`+strings.Join(limits, ",")+`]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"acme","name":"O","plan":"p"}`, 201)
	for _, team := range []string{"eng", "ops"} {
		r.mustDo("POST", "/v1/orgs/acme/teams", `{"id":"`+team+`","name":"T"}`, 201)
	}
	key := r.key("acme", `"check"`)
	path := func(team string, n int) []*ratelimitv3.RateLimitDescriptor {
		var ds []*ratelimitv3.RateLimitDescriptor
		for i := range n {
			ds = append(ds, withCost(desc(entry{"team", team}, entry{"metric", fmt.Sprintf("m%02d", i)}), 2))
		}
		return ds
	}
	ds := append(path("eng", 17), withCost(desc(entry{"team", "ops"}, entry{"metric", "m00"}), 5))
	res, err := r.should(key, 0, ds...)
	if err != nil {
		t.Fatalf("ShouldRateLimit = %v, want an answer", err)
	}
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(res.GetStatuses()) != 18 {
		t.Fatalf("overall %v with %d statuses", res.GetOverallCode(), len(res.GetStatuses()))
	}
	for i, st := range res.GetStatuses()[:17] {
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCurrentLimit() != nil {
			t.Errorf("eng's descriptor %d = %v, want OVER_LIMIT: the path is refused whole", i, st)
		}
	}
	if st := res.GetStatuses()[17]; st.GetCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("ops's descriptor = %v, want OK: another path is decided", st)
	}
	if h := headerOf(res, "Quotaplane-Refused"); !strings.Contains(h, "17 metrics") || !strings.Contains(h, "16 more descriptors refused") {
		t.Errorf("Quotaplane-Refused = %q", h)
	}
	// the org's counters (the plan's limits): ops's 5 of m00, nothing of eng's
	for i := range 17 {
		want := int64(0)
		if i == 0 {
			want = 5
		}
		if got := r.usedAt(key, `{"org":"acme"}`, fmt.Sprintf("m%02d", i)); got != want {
			t.Errorf("the org's m%02d used %d after eng's path was refused, want %d", i, got, want)
		}
	}
	res = r.mustShould(key, 0, path("eng", 16)...)
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("16 metrics on one path: %v", res)
	}
	for i := range 17 {
		want := int64(2)
		switch i {
		case 0:
			want = 7
		case 16:
			want = 0
		}
		if got := r.usedAt(key, `{"org":"acme"}`, fmt.Sprintf("m%02d", i)); got != want {
			t.Errorf("the org's m%02d used %d, want %d", i, got, want)
		}
	}
}

// A priced metric and 15 others on one path are 16 metrics named: one decision, with
// the spend its rate prices counted beside them (the engine's 17th counter), not an
// error. POST /v1/check's costs of the same 16 metrics are decided as well.
func TestAPricedPathOfSixteenMetricsIsDecided(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	limits := []string{`{"metric":"spend","window":"month","limit":1000000}`, `{"metric":"tokens","window":"month","limit":100000}`}
	for i := range 15 {
		limits = append(limits, fmt.Sprintf(`{"metric":"m%02d","window":"month","limit":1000}`, i))
	}
	r.mustDo("POST", "/v1/plans", `{"id":"p","name":"P","fail_mode":"closed","currency":"USD",
		"rates":[{"metric":"tokens","price":"2","per":1000}],"limits":[`+strings.Join(limits, ",")+`]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"acme","name":"O","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", `{"id":"eng","name":"T"}`, 201)
	key := r.key("acme", `"check"`)
	ds := []*ratelimitv3.RateLimitDescriptor{withCost(desc(entry{"team", "eng"}, entry{"metric", "tokens"}), 500)}
	for i := range 15 {
		ds = append(ds, withCost(desc(entry{"team", "eng"}, entry{"metric", fmt.Sprintf("m%02d", i)}), 1))
	}
	res, err := r.should(key, 0, ds...)
	if err != nil {
		t.Fatalf("ShouldRateLimit = %v, want an answer", err)
	}
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a priced metric and 15 others: %v", res)
	}
	team := `{"org":"acme"}` // the plan's limits: the org's counters
	if got := r.usedAt(key, team, "tokens"); got != 500 {
		t.Errorf("tokens used %d, want 500", got)
	}
	if got := r.usedAt(key, team, "m14"); got != 1 {
		t.Errorf("m14 used %d, want 1", got)
	}
	if got := r.usedAt(key, `{"org":"acme"}`, "spend"); got != 1000000 { // 500 tokens at 2 USD per 1000
		t.Errorf("spend %d micro-units, want 1000000", got)
	}
	costs := []string{`"tokens":1`}
	for i := range 15 {
		costs = append(costs, fmt.Sprintf(`"m%02d":1`, i))
	}
	if rec := r.do("POST", "/v1/check", key, `{"org":"acme","team":"eng","costs":{`+strings.Join(costs, ",")+`}}`); rec.Code != 429 {
		t.Errorf("POST /v1/check of the same 16 metrics = %d %s, want 429 (the month's spend is gone)", rec.Code, rec.Body)
	}
}

// No gRPC error, and no header of an answer, repeats more than 64 characters of a
// value a caller sent: a 1 MB descriptor key or value, or a long API key, whatever
// answers the call (no key, a bad key, a key without the check scope, a refused
// descriptor, a closed plan with its Redis down).
func TestNoLongValueIsEchoed(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 50)
	admin := r.key("acme", `"admin"`)
	mb, long := strings.Repeat("v", 1<<20), strings.Repeat("K", 100<<10)
	team128 := strings.Repeat("t", 128) // a valid id, longer than 64
	r.mustDo("POST", "/v1/orgs/acme/teams", `{"id":"`+team128+`","name":"T"}`, 201)
	calls := []struct {
		name  string
		key   string
		ds    []*ratelimitv3.RateLimitDescriptor
		value string
	}{
		{"no key", "", []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", mb})}, mb},
		{"a long bad key", long, []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", mb})}, long},
		{"a key without check", admin, []*ratelimitv3.RateLimitDescriptor{desc(entry{mb, mb})}, mb},
		{"a 1 MB value", key, []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", mb})}, mb},
		{"a 1 MB entry key", key, []*ratelimitv3.RateLimitDescriptor{desc(entry{mb, "x"})}, mb},
		{"a 1 MB org", key, []*ratelimitv3.RateLimitDescriptor{desc(entry{"org", mb})}, mb},
		{"a 1 MB user", key, []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", "eng"}, entry{"user", mb})}, mb},
		{"a 128-character team's user without team", key, []*ratelimitv3.RateLimitDescriptor{desc(entry{"user", team128})}, team128},
		{"a 128-character unknown team", key, []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", strings.Repeat("u", 128)})}, strings.Repeat("u", 128)},
		{"a 128-character unknown metric", key, []*ratelimitv3.RateLimitDescriptor{desc(entry{"metric", strings.Repeat("x", 128)})}, strings.Repeat("x", 128)},
	}
	check := func(name, value string, res *rlsv3.RateLimitResponse, err error) {
		t.Helper()
		if err != nil {
			st, _ := status.FromError(err)
			noLongRun(t, name+": the error "+st.Code().String(), st.Message(), value)
			return
		}
		for _, h := range res.GetResponseHeadersToAdd() {
			noLongRun(t, name+": "+h.GetKey(), h.GetValue(), value)
		}
	}
	for _, c := range calls {
		res, err := r.should(c.key, 0, c.ds...)
		check(c.name, c.value, res, err)
	}
	// a closed plan with its Redis down: UNAVAILABLE, for a call naming a long team
	r.mustDo("PATCH", "/v1/orgs/acme", `{"redis_url":"redis://127.0.0.1:1/0","redis_url_check":false}`, 200)
	_, err := r.should(key, 0, desc(entry{"team", team128}), desc(entry{"team", "eng"}, entry{"user", mb}))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Redis down under a closed plan = %v, want UNAVAILABLE", status.Code(err))
	}
	check("Redis down", team128, nil, err)
}
