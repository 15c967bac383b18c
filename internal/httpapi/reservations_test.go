package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// resReplica is one api process serving reservations and usage, with its router (a
// worker's sweep runs on it) and metrics registry.
type resReplica struct {
	*replica
	router *quota.Engines
	reg    *prometheus.Registry
	store  *billing.Store
	prefix string
}

// newResReplicas starts n api replicas over one database and one Redis key prefix.
func newResReplicas(t *testing.T, n int) []*resReplica {
	t.Helper()
	return newResReplicasLeasing(t, n, quota.LeaseConfig{})
}

// newResReplicasLeasing is newResReplicas with the engines' leases configured.
func newResReplicasLeasing(t *testing.T, n int, leases quota.LeaseConfig) []*resReplica {
	t.Helper()
	dbURL, prefix := testenv.PostgresURL(t), testenv.ID(t, "rs")
	var out []*resReplica
	for range n {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		pool, err := pgxpool.New(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
		reg := prometheus.NewRegistry()
		store := billing.NewStore(pool)
		router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: testRedisTimeout,
			Registerer: reg, Engine: quota.Config{KeyPrefix: prefix, Hydrator: store.Ledger(), Leases: leases}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = router.Close() })
		quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
		h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Checker: router, Redis: testenv.Redis(t), Registry: reg,
			AdminToken: operatorToken, Logger: quiet,
			Billing:  &billing.Service{Store: store, Tenants: svc, Counters: ledger.EngineCounters(router), Logger: quiet},
			Webhooks: &webhooks.Service{Store: webhooks.NewStore(pool), Tenants: svc}})
		if err != nil {
			t.Fatal(err)
		}
		r := &replica{f: &fixture{t: t, h: h, pool: pool, svc: svc, tokens: map[string]string{"operator": operatorToken}}}
		out = append(out, &resReplica{replica: r, router: router, reg: reg, store: store, prefix: prefix})
	}
	return out
}

// sweep runs the worker's reservation sweep on r's router every interval until the test ends.
func (r *resReplica) sweep(t *testing.T, interval time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r.router.RunReservationSweep(ctx, interval, func(err error) { t.Errorf("sweep: %v", err) })
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func (r *resReplica) reserve(token, body string) (int, api.Reservation, string) {
	rec := r.f.do("POST", "/v1/reservations", token, body)
	var res api.Reservation
	_ = json.Unmarshal(rec.Body.Bytes(), &res)
	return rec.Code, res, rec.Body.String()
}

func (r *resReplica) usage(t *testing.T, org, token string) api.Usage {
	t.Helper()
	rec := r.f.do("GET", "/v1/orgs/"+org+"/usage", token, "")
	if rec.Code != 200 {
		t.Fatalf("usage = %d %s", rec.Code, rec.Body)
	}
	var u api.Usage
	if err := json.Unmarshal(rec.Body.Bytes(), &u); err != nil {
		t.Fatal(err)
	}
	return u
}

func keyOf(r *replica, org, scopes string) string {
	var k api.ApiKeyCreated
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/"+org+"/api-keys", operatorToken, `{"name":"k","scopes":`+scopes+`}`, 201)), &k)
	return k.Secret
}

func TestReservationsOverHTTP(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"minute","limit":100},{"metric":"tokens","window":"month","limit":1000}]}`, 201)
	for _, org := range []string{"acme", "other"} {
		r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"p"}`, 201)
		r.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng"}`, 201)
	}
	key, otherKey, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "other", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)

	code, res, raw := r.reserve(key, `{"org":"acme","team":"eng","user":"alice","metric":"tokens","amount":60,"ttl_seconds":30}`)
	if code != 201 || res.State != "held" || res.Amount != 60 || res.OnExpiry != "commit" || res.Levels == nil || len(*res.Levels) != 2 {
		t.Fatalf("reserve = %d %s", code, raw)
	}
	if d := time.Until(res.ExpiresAt); d < 25*time.Second || d > 35*time.Second {
		t.Errorf("expires_at %s is not 30 s ahead", res.ExpiresAt)
	}
	// Held units count: 41 more do not fit the minute, nothing is held for them.
	if code, _, raw := r.reserve(key, `{"org":"acme","team":"eng","metric":"tokens","amount":41}`); code != 429 || !strings.Contains(raw, `"blocked_at"`) {
		t.Errorf("reserve over used + held = %d %s", code, raw)
	}
	if got := r.check(key, `{"org":"acme","team":"eng","metric":"tokens","cost":41}`); got.code != 429 {
		t.Errorf("check over used + held = %d %s", got.code, got.raw)
	}

	bad := []struct{ name, body string }{
		{"amount 0", `{"org":"acme","metric":"tokens","amount":0}`},
		{"amount < 0", `{"org":"acme","metric":"tokens","amount":-5}`},
		{"amount too large", `{"org":"acme","metric":"tokens","amount":9007199254740993}`},
		{"no amount", `{"org":"acme","metric":"tokens"}`},
		{"ttl 0", `{"org":"acme","metric":"tokens","amount":1,"ttl_seconds":0}`},
		{"ttl over an hour", `{"org":"acme","metric":"tokens","amount":1,"ttl_seconds":3601}`},
		{"bad on_expiry", `{"org":"acme","metric":"tokens","amount":1,"on_expiry":"keep"}`},
		{"unknown field", `{"org":"acme","metric":"tokens","amount":1,"cost":1}`},
	}
	for _, tc := range bad {
		rec := r.f.do("POST", "/v1/reservations", key, tc.body)
		if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"errors"`) {
			t.Errorf("%s: %d %s, want 400 naming the field", tc.name, rec.Code, rec.Body)
		}
	}
	if rec := r.f.do("POST", "/v1/reservations", key, `{"org":"acme","metric":"gpu","amount":1}`); rec.Code != 422 {
		t.Errorf("unknown metric: %d %s, want 422", rec.Code, rec.Body)
	}
	if rec := r.f.do("POST", "/v1/reservations", admin, `{"org":"acme","metric":"tokens","amount":1}`); rec.Code != 403 {
		t.Errorf("admin key: %d, want 403", rec.Code)
	}
	u := r.usage(t, "acme", admin)
	if len(u.Metrics) != 1 || u.Metrics[0].Org.Used+reservedOf(u.Metrics[0].Org) != 60 {
		t.Errorf("usage after refused reservations: %+v, want only the 60 held", u.Metrics)
	}

	path := "/v1/reservations/" + res.Id
	if rec := r.f.do("GET", path, otherKey, ""); rec.Code != 404 {
		t.Errorf("another org's GET = %d, want 404", rec.Code)
	}
	if rec := r.f.do("POST", path+"/commit", otherKey, `{"used":1}`); rec.Code != 404 {
		t.Errorf("another org's commit = %d, want 404", rec.Code)
	}
	if rec := r.f.do("GET", "/v1/reservations/r_nosuchreservation0000", key, ""); rec.Code != 404 {
		t.Errorf("unknown id = %d, want 404", rec.Code)
	}
	if rec := r.f.do("POST", path+"/commit", key, `{"used":-1}`); rec.Code != 400 {
		t.Errorf("used -1 = %d, want 400", rec.Code)
	}
	var got api.Reservation
	_ = json.Unmarshal([]byte(r.mustDo("POST", path+"/commit", key, `{"used":70}`, 200)), &got)
	if got.State != "committed" || *got.Used != 70 || *got.Released != 0 || *got.OverReserved != 10 {
		t.Errorf("commit = %+v", got)
	}
	again := r.mustDo("POST", path+"/commit", key, `{"used":5}`, 200)
	if !strings.Contains(again, `"used":70`) {
		t.Errorf("repeated commit = %s, want the first answer", again)
	}
	if body := r.mustDo("DELETE", path, key, "", 409); !strings.Contains(body, "committed") {
		t.Errorf("release after commit: %s, want 409 naming the state", body)
	}
	if body := r.mustDo("GET", path, key, "", 200); !strings.Contains(body, `"state":"committed"`) {
		t.Errorf("GET = %s", body)
	}

	_, rel, _ := r.reserve(key, `{"org":"acme","metric":"tokens","amount":5}`)
	if body := r.mustDo("DELETE", "/v1/reservations/"+rel.Id, key, "", 200); !strings.Contains(body, `"state":"released"`) || !strings.Contains(body, `"released":5`) {
		t.Errorf("release = %s", body)
	}
	if body := r.mustDo("POST", "/v1/reservations/"+rel.Id+"/commit", key, `{"used":1}`, 409); !strings.Contains(body, "released") {
		t.Errorf("commit after release: %s", body)
	}
	u = r.usage(t, "acme", admin)
	if org := u.Metrics[0].Org; org.Used != 70 || reservedOf(org) != 0 {
		t.Errorf("usage = %+v, want 70 used (over-reserved counted in full), none reserved", org)
	}
	m := r.reg
	for ev, want := range map[string]float64{"opened": 2, "committed": 1, "released": 1} {
		if got := reservationCounter(t, m, ev); got != want {
			t.Errorf("quotaplane_reservations_total{event=%q} = %v, want %v", ev, got, want)
		}
	}
}

func reservationCounter(t *testing.T, reg *prometheus.Registry, event string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "quotaplane_reservations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == event {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// Done when: 64 concurrent clients over 2 api replicas open reservations of random
// amounts on one org (several teams and users), commit random used <= amount, release
// some, leave some to expire (two workers' sweeps running); the usage API, sampled
// all along, never shows used + reserved over any limit of any level, and at the end
// every level's usage is exactly the sum of its committed units.
func TestReservationsExactUnderConcurrency(t *testing.T) {
	rs := newResReplicas(t, 2)
	a := rs[0]
	a.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"minute","limit":4000},{"metric":"tokens","window":"month","limit":6000}]}`, 201)
	a.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"O","plan":"p"}`, 201)
	teams := []string{"t1", "t2"}
	for _, team := range teams {
		a.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"`+team+`","name":"T","limits":[{"metric":"tokens","window":"month","limit":3000}],"user_limits":[{"metric":"tokens","window":"month","limit":900}]}`, 201)
	}
	key, admin := keyOf(a.replica, "acme", `["check"]`), keyOf(a.replica, "acme", `["admin"]`)
	for _, r := range rs {
		r.sweep(t, 100*time.Millisecond)
	}

	type settled struct {
		team, user string
		units      int64
	}
	var mu sync.Mutex
	var committed []settled
	var pending []string // reservations left to expire with on_expiry commit: counted once expired
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	samples := 0
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			u := rs[samples%2].usage(t, "acme", admin)
			samples++
			for _, m := range u.Metrics {
				for _, l := range append(append([]api.UsageLevel{m.Org}, m.Teams...), m.Users...) {
					for _, w := range l.Limits {
						if w.Used > w.Limit {
							t.Errorf("sampled %s: used %d over its %s limit %d", l.Id, w.Used, w.Window, w.Limit)
						}
					}
					if lim := monthLimit(l); lim > 0 && l.Used+reservedOf(l) > lim {
						t.Errorf("sampled %s: used %d + reserved %d over the month limit %d", l.Id, l.Used, reservedOf(l), lim)
					}
				}
			}
		}
	})
	var clients sync.WaitGroup
	var denied, opened int64
	for c := range 64 {
		clients.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 14))
			r := rs[c%2]
			for range 12 {
				team, user := teams[rng.IntN(2)], fmt.Sprintf("u%d", rng.IntN(4))
				amount := 1 + rng.Int64N(60)
				action := rng.IntN(10)
				onExpiry := "commit"
				if action == 9 {
					onExpiry = "release"
				}
				code, res, raw := r.reserve(key, fmt.Sprintf(`{"org":"acme","team":%q,"user":%q,"metric":"tokens","amount":%d,"ttl_seconds":1,"on_expiry":%q}`, team, user, amount, onExpiry))
				switch code {
				case 429:
					mu.Lock()
					denied++
					mu.Unlock()
					continue
				case 201:
				default:
					t.Errorf("reserve = %d %s", code, raw)
					return
				}
				mu.Lock()
				opened++
				mu.Unlock()
				other := rs[rng.IntN(2)] // settled through either replica
				switch {
				case action < 6:
					used := rng.Int64N(amount + 1)
					rec := other.f.do("POST", "/v1/reservations/"+res.Id+"/commit", key, fmt.Sprintf(`{"used":%d}`, used))
					switch rec.Code {
					case 200:
						mu.Lock()
						committed = append(committed, settled{team, user, used})
						mu.Unlock()
					case 409: // it expired first (ttl 1 s, a slow machine): its on_expiry commit counts
						mu.Lock()
						pending = append(pending, res.Id+" "+team+" "+user)
						mu.Unlock()
					default:
						t.Errorf("commit = %d %s", rec.Code, rec.Body)
					}
				case action < 8:
					rec := other.f.do("DELETE", "/v1/reservations/"+res.Id, key, "")
					if rec.Code == 409 {
						mu.Lock()
						pending = append(pending, res.Id+" "+team+" "+user)
						mu.Unlock()
					} else if rec.Code != 200 {
						t.Errorf("release = %d %s", rec.Code, rec.Body)
					}
				default:
					mu.Lock()
					pending = append(pending, res.Id+" "+team+" "+user)
					mu.Unlock()
				}
			}
		})
	}
	clients.Wait()
	time.Sleep(2500 * time.Millisecond) // every reservation expired and swept (ttl 1 s, sweeps every 100 ms)
	close(stop)
	sampler.Wait()

	for _, p := range pending {
		f := strings.Fields(p)
		rec := a.f.do("GET", "/v1/reservations/"+f[0], key, "")
		var res api.Reservation
		_ = json.Unmarshal(rec.Body.Bytes(), &res)
		if res.State == "held" || res.Used == nil {
			t.Fatalf("reservation %s still %s after its expiry", f[0], res.State)
		}
		committed = append(committed, settled{f[1], f[2], *res.Used})
	}
	want := map[string]int64{}
	for _, c := range committed {
		want["acme"] += c.units
		want[c.team] += c.units
		want[c.team+"/"+c.user] += c.units
	}
	got := map[string]int64{}
	u := a.usage(t, "acme", admin)
	for _, m := range u.Metrics {
		got["acme"] = m.Org.Used
		for _, l := range m.Teams {
			got[l.Id] = l.Used
		}
		for _, l := range m.Users {
			got[*l.Team+"/"+l.Id] = l.Used
		}
		for _, l := range append(append([]api.UsageLevel{m.Org}, m.Teams...), m.Users...) {
			if reservedOf(l) != 0 {
				t.Errorf("%s still has %d reserved", l.Id, reservedOf(l))
			}
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("usage of %s = %d, want the sum of its committed units %d", k, got[k], v)
		}
	}
	t.Logf("%d opened, %d denied, %d settled, %d usage samples; org used %d", opened, denied, len(committed), samples, got["acme"])
	if denied == 0 || samples < 10 {
		t.Errorf("the run never reached a limit (%d denied) or was barely sampled (%d)", denied, samples)
	}
}

func monthLimit(l api.UsageLevel) int64 {
	for _, w := range l.Limits {
		if w.Window == "month" {
			return w.Limit
		}
	}
	return 0
}

func reservedOf(l api.UsageLevel) int64 { return l.Reserved }

// Redis restarted empty with reservations open: hydration restores the held ones
// from the last flush with their units, so they still count and are settled once;
// what changed after that flush is lost (at most one flush interval), nothing is
// given back twice. The "restart" deletes every key of the test's prefix (the shared
// test Redis serves other tests: FLUSHDB would wipe theirs).
func TestReservationsSurviveRedisRestart(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"tokens","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"O","plan":"p"}`, 201)
	key, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
	quiet := slog.New(slog.NewJSONHandler(io.Discard, nil))
	flusher := ledger.NewFlusher(ledger.FlusherConfig{Store: r.store.Ledger(), Tenants: r.f.svc, Counters: ledger.EngineCounters(r.router), Logger: quiet})
	ctx := context.Background()
	reserve := func(amount int) string {
		code, res, raw := r.reserve(key, fmt.Sprintf(`{"org":"acme","metric":"tokens","amount":%d,"ttl_seconds":600}`, amount))
		if code != 201 {
			t.Fatalf("reserve = %d %s", code, raw)
		}
		return res.Id
	}
	a, b, c := reserve(100), reserve(50), reserve(30)
	r.mustDo("POST", "/v1/reservations/"+c+"/commit", key, `{"used":10}`, 200)
	if got := r.check(key, `{"org":"acme","metric":"tokens","cost":5}`); got.code != 200 {
		t.Fatalf("check = %d %s", got.code, got.raw)
	}
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// The export bills committed units only: 10 + 5, not the 150 held.
	if csv := r.mustDo("GET", "/v1/orgs/acme/billing/export?format=csv", operatorToken, "", 200); !strings.Contains(csv, ",tokens,15") || strings.Contains(csv, "165") {
		t.Errorf("export with reservations held:\n%s", csv)
	}
	r.mustDo("POST", "/v1/reservations/"+b+"/commit", key, `{"used":20}`, 200) // after the flush: lost with Redis

	wipePrefix(t, r)

	// The first request after the loss hydrates: here a settlement.
	var got api.Reservation
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/reservations/"+a+"/commit", key, `{"used":40}`, 200)), &got)
	if *got.Used != 40 || *got.Released != 60 {
		t.Errorf("commit after the restart = %+v", got)
	}
	org := r.usage(t, "acme", admin).Metrics[0].Org
	if org.Used != 55 || org.Reserved != 50 || org.Limits[0].Used != 105 {
		t.Errorf("usage after the restart: used %d reserved %d (limit's used %d), want 10 + 5 + 40 used and b's 50 held again",
			org.Used, org.Reserved, org.Limits[0].Used)
	}
	if body := r.mustDo("GET", "/v1/reservations/"+b, key, "", 200); !strings.Contains(body, `"state":"held"`) {
		t.Errorf("b after the restart = %s, want held as last persisted", body)
	}
	r.mustDo("DELETE", "/v1/reservations/"+b, key, "", 200)
	d := reserve(7)
	if _, err := flusher.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	// Again: a, b and c are settled for good, d comes back; here a read hydrates.
	wipePrefix(t, r)
	if body := r.mustDo("GET", "/v1/reservations/"+d, key, "", 200); !strings.Contains(body, `"state":"held"`) {
		t.Errorf("d after the second restart = %s, want held", body)
	}
	// Settled ones come back for reads and repeated settlements, counting nothing.
	if body := r.mustDo("POST", "/v1/reservations/"+a+"/commit", key, `{"used":1}`, 200); !strings.Contains(body, `"used":40`) {
		t.Errorf("repeated commit of a after the second restart = %s, want the first answer", body)
	}
	org = r.usage(t, "acme", admin).Metrics[0].Org
	if org.Used != 55 || org.Reserved != 7 {
		t.Errorf("usage after the second restart: used %d reserved %d, want 55 and 7", org.Used, org.Reserved)
	}
}

// wipePrefix deletes every key of the replica's engine prefix.
func wipePrefix(t *testing.T, r *resReplica) {
	t.Helper()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	iter := rdb.Scan(ctx, 0, r.prefix+":*", 1000).Iterator()
	n := 0
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
		n++
	}
	if err := iter.Err(); err != nil || n == 0 {
		t.Fatalf("wipe %s: %d keys, %v", r.prefix, n, err)
	}
}
