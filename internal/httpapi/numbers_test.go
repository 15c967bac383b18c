package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// redisState is every key of prefix with its serialized value: equal states, nothing
// written.
func redisState(t *testing.T, prefix string) string {
	t.Helper()
	ctx := context.Background()
	c := testenv.Redis(t)
	ks, err := c.Keys(ctx, prefix+":*").Result()
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(ks)
	var b strings.Builder
	for _, k := range ks {
		switch c.Type(ctx, k).Val() {
		case "hash":
			m := c.HGetAll(ctx, k).Val()
			fs := make([]string, 0, len(m))
			for f, v := range m {
				fs = append(fs, f+"="+v)
			}
			sort.Strings(fs)
			fmt.Fprintf(&b, "%s %v\n", k, fs)
		case "string":
			fmt.Fprintf(&b, "%s %s\n", k, c.Get(ctx, k).Val())
		case "set":
			m := c.SMembers(ctx, k).Val()
			sort.Strings(m)
			fmt.Fprintf(&b, "%s %v\n", k, m)
		case "zset":
			fmt.Fprintf(&b, "%s %v\n", k, c.ZRangeWithScores(ctx, k, 0, -1).Val())
		}
	}
	return b.String()
}

// flusher is the worker's flush over r's router and ledger.
func (r *resReplica) flusher() *ledger.Flusher {
	return ledger.NewFlusher(ledger.FlusherConfig{Store: r.store.Ledger(), Tenants: r.f.svc, Counters: ledger.EngineCounters(r.router),
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
}

// bigNumber finds a number of 16 digits or more (>= 10^15, near the bounds) in a body.
var bigNumber = regexp.MustCompile(`\d{16,}`)

// Every hostile number over HTTP: a cost, amount, used, limit (plan, org override,
// team and user allocation), grant or adjustment above vocab.MaxUnits (2^50), or below
// its minimum, is refused with a 400 problem naming the field and the bound, and
// writes nothing (Redis, the tenancy tables, the audit log). Afterwards the org's
// checks answer 200 and its usage and export are sane: a used of 2^53 taken would
// break the org's metric (503 on every check).
func TestHostileNumbersAreRefusedOverHTTP(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"open","limits":[{"metric":"tokens","window":"minute","limit":100},{"metric":"tokens","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"shade","name":"S","plan":"p","mode":"shadow"}`, 201)
	for _, org := range []string{"acme", "shade"} {
		r.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng","limits":[{"metric":"tokens","window":"month","limit":500}]}`, 201)
		r.mustDo("POST", "/v1/orgs/"+org+"/teams/eng/users", operatorToken, `{"id":"alice"}`, 201)
	}
	key, shade, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "shade", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
	code, res, raw := r.reserve(key, `{"org":"acme","team":"eng","metric":"tokens","amount":10}`)
	if code != 201 {
		t.Fatalf("reserve = %d %s", code, raw)
	}
	commit := "/v1/reservations/" + res.Id + "/commit"

	const two53, over, bound = "9007199254740992", "1125899906842625", "1125899906842624"
	hostile := []struct {
		name, method, path, token, body, field string
	}{
		{"commit used 2^53", "POST", commit, key, `{"used":` + two53 + `}`, "used"},
		{"commit used past the bound", "POST", commit, key, `{"used":` + over + `}`, "used"},
		{"check cost 2^53, enforce", "POST", "/v1/check", key, `{"org":"acme","team":"eng","metric":"tokens","cost":` + two53 + `}`, "cost"},
		{"check cost 2^53, shadow", "POST", "/v1/check", shade, `{"org":"shade","team":"eng","metric":"tokens","cost":` + two53 + `}`, "cost"},
		{"check cost past the bound", "POST", "/v1/check", key, `{"org":"acme","metric":"tokens","cost":` + over + `}`, "cost"},
		{"check cost negative", "POST", "/v1/check", key, `{"org":"acme","metric":"tokens","cost":-1}`, "cost"},
		{"reserve amount 2^53", "POST", "/v1/reservations", key, `{"org":"acme","metric":"tokens","amount":` + two53 + `}`, "amount"},
		{"reserve amount past the bound", "POST", "/v1/reservations", key, `{"org":"acme","metric":"tokens","amount":` + over + `}`, "amount"},
		{"plan limit 2^53", "POST", "/v1/plans", operatorToken, `{"id":"big","name":"B","limits":[{"metric":"tokens","window":"month","limit":` + two53 + `}]}`, "limits[0].limit"},
		{"plan patch limit past the bound", "PATCH", "/v1/plans/p", operatorToken, `{"limits":[{"metric":"tokens","window":"month","limit":` + over + `}]}`, "limits[0].limit"},
		{"org override 2^53", "PATCH", "/v1/orgs/acme", operatorToken, `{"limits":[{"metric":"tokens","window":"month","limit":` + two53 + `}]}`, "limits[0].limit"},
		{"team allocation 2^53", "POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"ops","name":"Ops","limits":[{"metric":"tokens","window":"month","limit":` + two53 + `}]}`, "limits[0].limit"},
		{"team user allocation past the bound", "PATCH", "/v1/orgs/acme/teams/eng", operatorToken, `{"user_limits":[{"metric":"tokens","window":"month","limit":` + over + `}]}`, "user_limits[0].limit"},
		{"team allocation negative", "PATCH", "/v1/orgs/acme/teams/eng", operatorToken, `{"limits":[{"metric":"tokens","window":"month","limit":-1}]}`, "limits[0].limit"},
		{"user allocation 2^53", "PATCH", "/v1/orgs/acme/teams/eng/users/alice", operatorToken, `{"limits":[{"metric":"tokens","window":"month","limit":` + two53 + `}]}`, "limits[0].limit"},
		{"grant 2^53", "POST", "/v1/orgs/acme/grants", operatorToken, `{"metric":"tokens","units":` + two53 + `,"reason":"x"}`, "units"},
		{"adjustment set 2^53", "POST", "/v1/orgs/acme/usage/adjustments", operatorToken, `{"metric":"tokens","set":` + two53 + `,"reason":"x"}`, "set"},
		{"adjustment add -2^53", "POST", "/v1/orgs/acme/usage/adjustments", operatorToken, `{"metric":"tokens","add":-` + two53 + `,"reason":"x"}`, "add"},
	}
	// Not numbers, but as hostile: a commit of null used (it committed 0), and text with
	// a NUL, which Postgres cannot store (an adjustment moved the counter, then failed
	// on its audit row with a 503, so a retried add applied twice; other routes 500).
	malformed := []struct {
		name, method, path, token, body, field string
	}{
		{"commit used null", "POST", commit, key, `{"used":null}`, "used"},
		{"adjustment reason with a NUL", "POST", "/v1/orgs/acme/usage/adjustments", operatorToken, `{"metric":"tokens","add":4,"reason":"x\u0000"}`, "reason"},
		{"adjustment set, reason a NUL", "POST", "/v1/orgs/acme/usage/adjustments", operatorToken, `{"metric":"tokens","set":12,"reason":"\u0000"}`, "reason"},
		{"team name with a NUL", "POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"n1","name":"a\u0000b"}`, "name"},
		{"team patch name with a NUL", "PATCH", "/v1/orgs/acme/teams/eng", operatorToken, `{"name":"a\u0000"}`, "name"},
		{"key name with a NUL", "POST", "/v1/orgs/acme/api-keys", operatorToken, `{"name":"k\u0000","scopes":["check"]}`, "name"},
		{"plan name with a NUL", "POST", "/v1/plans", operatorToken, `{"id":"nul","name":"\u0000","fail_mode":"open","limits":[]}`, "name"},
		{"grant reason with a NUL", "POST", "/v1/orgs/acme/grants", operatorToken, `{"metric":"tokens","units":5,"reason":"\u0000"}`, "reason"},
		{"throttle reason with a NUL", "PUT", "/v1/orgs/acme/throttle", operatorToken, `{"factor":0.5,"reason":"\u0000"}`, "reason"},
	}
	before, audits := redisState(t, r.prefix), r.f.auditRows()
	orgBefore := r.mustDo("GET", "/v1/orgs/acme", operatorToken, "", 200)
	// refused sends h and reports whether it was a 400 problem naming h's field.
	refused := func(name, method, path, token, body, field string) (string, bool) {
		rec := r.f.do(method, path, token, body)
		var p api.Problem
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		named := false
		for _, fe := range p.Errors {
			named = named || fe.Field == field
		}
		if rec.Code != 400 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json") || !named {
			t.Errorf("%s: %d %s, want a 400 problem naming %s", name, rec.Code, rec.Body, field)
			return "", false
		}
		return rec.Body.String(), true
	}
	for _, h := range malformed {
		refused(h.name, h.method, h.path, h.token, h.body, h.field)
	}
	for _, h := range hostile {
		answer, ok := refused(h.name, h.method, h.path, h.token, h.body, h.field)
		if ok && !strings.Contains(h.body, "-") && !strings.Contains(answer, bound) {
			t.Errorf("%s: %s does not state the bound %s", h.name, answer, bound)
		}
	}
	// A batch refuses the item, in the same words, and decides the others.
	rec := r.f.do("POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","metric":"tokens","cost":`+two53+`},{"org":"acme","metric":"tokens","cost":0}]}`)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"field":"cost"`) || !strings.Contains(rec.Body.String(), bound) ||
		!strings.Contains(rec.Body.String(), `"allowed":true`) {
		t.Errorf("batch with a cost of 2^53: %d %s, want the item refused naming cost and the bound", rec.Code, rec.Body)
	}
	if after := redisState(t, r.prefix); after != before {
		t.Errorf("hostile requests wrote to Redis:\nbefore %s\nafter  %s", before, after)
	}
	if n := r.f.auditRows(); n != audits {
		t.Errorf("hostile requests wrote %d audit rows", n-audits)
	}
	if got := r.mustDo("GET", "/v1/orgs/acme", operatorToken, "", 200); got != orgBefore {
		t.Errorf("org changed:\n%s\n%s", orgBefore, got)
	}
	r.mustDo("GET", "/v1/plans/big", operatorToken, "", 404)
	// A reservation id of 5,000 characters is not echoed whole.
	if got := r.mustDo("GET", "/v1/reservations/r_"+strings.Repeat("a", 5000), key, "", 404); len(got) > 1000 {
		t.Errorf("a 404 of a 5,000-character reservation id is %d bytes: %.200s...", len(got), got)
	}

	// The org is healthy: its reservation still commits, checks are decided exactly.
	r.mustDo("POST", commit, key, `{"used":10}`, 200)
	for _, c := range []struct{ token, body string }{
		{key, `{"org":"acme","team":"eng","user":"alice","metric":"tokens","cost":5}`},
		{key, `{"org":"acme","team":"eng","metric":"tokens","cost":0}`},
		{shade, `{"org":"shade","team":"eng","user":"alice","metric":"tokens","cost":5}`},
	} {
		if got := r.check(c.token, c.body); got.code != 200 || got.body.Degraded != nil && *got.body.Degraded {
			t.Errorf("check %s after the hostile requests = %d %s", c.body, got.code, got.raw)
		}
	}
	u := r.usage(t, "acme", admin)
	if len(u.Metrics) != 1 || u.Metrics[0].Org.Used != 15 {
		t.Errorf("usage after the hostile requests: %+v, want 15 tokens", u.Metrics)
	}
	if _, err := r.flusher().FlushOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	export := r.mustDo("GET", "/v1/orgs/acme/billing/export?format=json&period="+u.Period, admin, "", 200)
	if bigNumber.MatchString(export) || !strings.Contains(export, "15") {
		t.Errorf("export after the hostile requests: %s", export)
	}
	if q := vocab.MaxUnits; fmt.Sprint(q) != bound {
		t.Fatalf("bound %d", q)
	}
}

// An operator corrects a wrong counter (here 2^53 + 1, as the old code let a commit
// store): POST /v1/orgs/{org}/usage/adjustments sets it, checks see it at once, the
// ledger is lowered with it and stays so across a drain (even one whose snapshot
// began before the adjustment) and across Redis losing the org's keys (hydration),
// and the audit log has who, before, after and why. Bad input is a 400 naming the
// field. On the old code there was no such route (404).
func TestAdjustmentFixesAWrongCounter(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"eng","name":"Eng"}`, 201)
	key, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
	ctx := context.Background()
	r.mustDo("POST", "/v1/check", key, `{"org":"acme","team":"eng","metric":"tokens","cost":1}`, 200)
	per := vocab.PeriodAt(time.Now(), 0)
	month := fmt.Sprintf("%s:{acme}|m|%s", r.prefix, per.ID)
	rdb := testenv.Redis(t)
	if err := rdb.HSet(ctx, month, "tokens|o", "9007199254740993", "tokens|t|eng", "9007199254740993").Err(); err != nil {
		t.Fatal(err)
	}
	rdb.SAdd(ctx, fmt.Sprintf("%s:{acme}|d|%s", r.prefix, per.ID), "tokens|o", "tokens|t|eng")
	flusher := r.flusher()
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := r.check(key, `{"org":"acme","team":"eng","metric":"tokens","cost":1}`); got.code != 429 {
		t.Fatalf("check over the wrong counter = %d %s, want 429 (not a 503)", got.code, got.raw)
	}

	for _, bad := range []struct{ body, field string }{
		{`{"metric":"tokens","set":1,"add":1,"reason":"x"}`, "set"},
		{`{"metric":"tokens","reason":"x"}`, "set"},
		{`{"metric":"tokens","user":"alice","set":1,"reason":"x"}`, "team"},
		{`{"metric":"tokens","set":1,"reason":""}`, "reason"},
		{`{"metric":"tokens","set":-1,"reason":"x"}`, "set"},
		{`{"metric":"to kens","set":1,"reason":"x"}`, "metric"},
	} {
		rec := r.f.do("POST", "/v1/orgs/acme/usage/adjustments", operatorToken, bad.body)
		if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"field":"`+bad.field+`"`) {
			t.Errorf("%s: %d %s, want 400 naming %s", bad.body, rec.Code, rec.Body, bad.field)
		}
	}
	r.mustDo("POST", "/v1/orgs/acme/usage/adjustments", admin, `{"metric":"tokens","set":1,"reason":"x"}`, 403)

	var adj api.UsageAdjustment
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/acme/usage/adjustments", operatorToken,
		`{"metric":"tokens","set":40,"reason":"ticket 22: a commit of 2^53"}`, 200)), &adj)
	if adj.Before != quota.MaxCounter || adj.After != 40 || adj.Level != "org" || adj.Period != per.ID || adj.Actor != "operator" {
		t.Errorf("adjustment = %+v", adj)
	}
	r.mustDo("POST", "/v1/orgs/acme/usage/adjustments", operatorToken, `{"metric":"tokens","team":"eng","add":-1125899906842624,"reason":"ticket 22"}`, 200)
	r.mustDo("POST", "/v1/orgs/acme/usage/adjustments", operatorToken, `{"metric":"tokens","team":"eng","set":40,"reason":"ticket 22"}`, 200)

	// Checks see it at once.
	if got := r.check(key, `{"org":"acme","team":"eng","metric":"tokens","cost":2}`); got.code != 200 || got.body.Levels[0].Used != 42 {
		t.Fatalf("check after the adjustment = %d %s, want 200 with 42 used", got.code, got.raw)
	}
	orgUsed := func() (int64, int64) {
		u := r.usage(t, "acme", admin)
		var team int64 = -1
		for _, tm := range u.Metrics[0].Teams {
			if tm.Id == "eng" {
				team = tm.Used
			}
		}
		return u.Metrics[0].Org.Used, team
	}
	if o, tm := orgUsed(); o != 42 || tm != 42 {
		t.Errorf("usage after the adjustment: org %d, team %d, want 42, 42", o, tm)
	}
	// A drain whose snapshot began before the adjustment does not raise it back; one
	// after it does raise as ever.
	stale := quota.Drained{Counters: map[quota.Counter]int64{{Metric: "tokens", Level: vocab.LevelOrg}: quota.MaxCounter},
		At: adj.At.Add(-time.Millisecond)}
	if _, err := r.store.Ledger().PersistDrained(ctx, "acme", per.ID, time.Now(), stale); err != nil {
		t.Fatal(err)
	}
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	stored, err := r.store.Ledger().Usage(ctx, "acme", per.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := stored[quota.Counter{Metric: "tokens", Level: vocab.LevelOrg}]; got != 42 {
		t.Errorf("ledger after a stale drain and a flush = %d, want 42", got)
	}
	// Redis loses the org's keys: hydration restores the adjusted values.
	if ks := rdb.Keys(ctx, r.prefix+":{acme}*").Val(); len(ks) > 0 {
		rdb.Del(ctx, ks...)
	}
	if got := r.check(key, `{"org":"acme","team":"eng","metric":"tokens","cost":1}`); got.code != 200 || got.body.Levels[0].Used != 43 {
		t.Errorf("check after Redis lost the org = %d %s, want 200 with 43 used", got.code, got.raw)
	}
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if o, tm := orgUsed(); o != 43 || tm != 43 {
		t.Errorf("usage after Redis loss and a drain: org %d, team %d, want 43, 43", o, tm)
	}
	export := r.mustDo("GET", "/v1/orgs/acme/billing/export?format=json&period="+per.ID, admin, "", 200)
	if bigNumber.MatchString(export) {
		t.Errorf("export after the adjustment: %s", export)
	}
	// Audited: who, when, before, after, why.
	audit := r.mustDo("GET", "/v1/orgs/acme/audit", operatorToken, "", 200)
	for _, want := range []string{`"action":"usage.adjust"`, `"object":"usage:` + per.ID + `:tokens"`, `"units":2251799813685248`,
		`"units":40`, `"reason":"ticket 22: a commit of 2^53"`, `"actor":"operator"`, `"object":"usage:` + per.ID + `:tokens/eng"`} {
		if !strings.Contains(audit, want) {
			t.Errorf("audit log lacks %s: %s", want, audit)
		}
	}
}

// The adversarial tester's case: a metric with no limit at any level (metered only),
// checked twice at cost 2^50, has its month counters at 2^51. Every later check of it,
// by any team or user, is still decided (200: nothing limits it), and its usage reads
// 2^51; a limited metric's 429 still names the limit that refused it (blocked_at) with
// its RateLimit headers. On the old code every gpu_seconds check of the org was a 429
// with "levels":[] and no blocked_at until the month's end.
func TestUnlimitedMetricAtTheBoundIsNeverALockout(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"month","limit":10}],"metered":["gpu_seconds"]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	for _, team := range []string{"eng", "ops"} {
		r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"`+team+`","name":"T"}`, 201)
	}
	key, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
	const bound = "1125899906842624"
	for i := range 2 {
		if got := r.check(key, `{"org":"acme","team":"eng","user":"zed","metric":"gpu_seconds","cost":`+bound+`}`); got.code != 200 || !got.body.Allowed {
			t.Fatalf("check %d of 2^50 = %d %s", i+1, got.code, got.raw)
		}
	}
	for _, body := range []string{
		`{"org":"acme","team":"eng","user":"zed","metric":"gpu_seconds","cost":1}`,
		`{"org":"acme","team":"ops","user":"amy","metric":"gpu_seconds","cost":1}`,
		`{"org":"acme","metric":"gpu_seconds","cost":` + bound + `}`,
	} {
		if got := r.check(key, body); got.code != 200 || !got.body.Allowed {
			t.Errorf("check %s of the metric with no limit = %d %s, want 200: nothing limits it", body, got.code, got.raw)
		}
	}
	for _, m := range r.usage(t, "acme", admin).Metrics {
		if m.Metric == "gpu_seconds" && m.Org.Used != quota.MaxCounter {
			t.Errorf("gpu_seconds org used %d, want the bound %d", m.Org.Used, quota.MaxCounter)
		}
	}
	// a 429 names what refused it, with its headers
	r.mustDo("POST", "/v1/check", key, `{"org":"acme","team":"eng","metric":"tokens","cost":10}`, 200)
	got := r.check(key, `{"org":"acme","team":"eng","metric":"tokens","cost":1}`)
	if b := got.body.BlockedAt; got.code != 429 || b == nil || b.Level != vocab.LevelOrg || b.Id != "acme" || b.Window != vocab.Month ||
		rawHeader(got.header, "RateLimit-Limit") != "10" || rawHeader(got.header, "RateLimit-Remaining") != "0" {
		t.Errorf("tokens past its limit = %d %v %s, want a 429 naming the org's month with its RateLimit headers", got.code, got.header, got.raw)
	}
}
