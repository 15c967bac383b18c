package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// privatePostgres is a Postgres cluster of the test's own, made with initdb and run
// with pg_ctl, which the test may stop and start again on the same port.
type privatePostgres struct {
	bin  string // directory of initdb and pg_ctl
	root string // owned by the cluster's user: data/, the socket, server.log
	port int
	as   []string // command prefix running a binary as the cluster's user ("runuser -u postgres --"), or none
}

// mustPrivatePostgres initialises and starts a cluster on a free loopback port; it
// is stopped and removed when the test ends. The test is skipped when there are no
// server binaries.
func mustPrivatePostgres(t *testing.T) *privatePostgres {
	t.Helper()
	ctls, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(ctls) == 0 {
		t.Skip("no Postgres server binaries (/usr/lib/postgresql/*/bin/initdb, pg_ctl): this test runs a cluster of its own")
	}
	slices.SortFunc(ctls, func(a, b string) int { return versionOf(a) - versionOf(b) })
	p := &privatePostgres{bin: filepath.Dir(ctls[len(ctls)-1]), port: testenv.FreePort(t)}
	root, err := os.MkdirTemp("", "qp-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	p.root = root
	if os.Geteuid() == 0 {
		// initdb refuses to run as root: the cluster belongs to the postgres user. Not
		// t.TempDir: its parent is private to root.
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skipf("running as root and there is no postgres user to own a cluster: %v", err)
		}
		if _, err := exec.LookPath("runuser"); err != nil {
			t.Skipf("running as root without runuser to start Postgres as its user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatal(err)
		}
		p.as = []string{"runuser", "-u", "postgres", "--"}
	}
	p.run(t, "initdb", "-D", p.data(), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-sync")
	t.Cleanup(func() { _ = p.ctl("stop", "-m", "immediate") }) // an error when it is not running
	p.start(t)
	return p
}

// versionOf reads the major version in /usr/lib/postgresql/<version>/bin/pg_ctl.
func versionOf(ctl string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(ctl))))
	return v
}

func (p *privatePostgres) data() string { return filepath.Join(p.root, "data") }

// URL is the database the api uses; pgdb.Open creates it, as at a first start.
func (p *privatePostgres) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/quotaplane?sslmode=disable", p.port)
}

func (p *privatePostgres) command(name string, args ...string) *exec.Cmd {
	argv := append(append(slices.Clone(p.as), filepath.Join(p.bin, name)), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = p.root // a directory the cluster's user may enter
	return cmd
}

func (p *privatePostgres) run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	if out, err := p.command(name, args...).CombinedOutput(); err != nil {
		tb.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

func (p *privatePostgres) ctl(args ...string) error {
	args = append([]string{"-D", p.data(), "-w", "-t", "60"}, args...)
	if out, err := p.command("pg_ctl", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// start starts the server and waits until it accepts connections. fsync is off: the
// test crashes the server, never the machine, so what a commit wrote to the kernel
// survives, and crash recovery is as it would be with fsync on.
func (p *privatePostgres) start(tb testing.TB) {
	tb.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40", p.port, p.root)
	if err := p.ctl("-l", filepath.Join(p.root, "server.log"), "-o", opts, "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(p.root, "server.log"))
		tb.Fatalf("%v\nserver.log:\n%s", err, log)
	}
}

// crash stops the server at once (pg_ctl stop -m immediate): every backend is
// killed without a checkpoint, transactions in flight are lost, and the next start
// runs crash recovery.
func (p *privatePostgres) crash(tb testing.TB) {
	tb.Helper()
	if err := p.ctl("stop", "-m", "immediate"); err != nil {
		tb.Fatal(err)
	}
}

// apiCall is one admin call made while Postgres was down.
type apiCall struct {
	what   string
	code   int
	ctype  string
	detail string
	took   time.Duration // wall time
	ran    time.Duration // took, less the stalls of the process
}

// TestPostgresStoppedFor30s wires the api as cmd/api does (tenants Service over a
// private Postgres, the tenants Cache with its production TTLs, a quota Router on
// Redis), warms it up, then stops Postgres (pg_ctl stop -m immediate) for 30 s under
// a continuous load of checks. Checks go on from the cache; admin calls answer 503
// problem+json within a second; /readyz reports Postgres down. After the restart the
// admin API works again, every team create answered 201 survived the crash, and every
// one attempted around and during the outage is either absent or complete, with
// exactly its audit row.
//
// A committed change drops its org from every replica's cache, so the first checks
// of an org changed just before an outage need Postgres and get 503 for as long as
// it lasts; the creates that race the crash therefore go to an org without checks.
func TestPostgresStoppedFor30s(t *testing.T) {
	t.Parallel()
	const (
		outage      = 30 * time.Second
		adminBound  = time.Second // each admin call during the outage
		workers     = 8
		normalShare = 0.999
	)
	pg := mustPrivatePostgres(t)
	stalls := testenv.WatchStalls(t) // the 1 s bound applies to the time the process ran
	ctx := context.Background()
	logs := &testenv.Buffer{}
	log := slog.New(slog.NewJSONHandler(logs, nil))

	openCtx, cancelOpen := context.WithTimeout(ctx, 30*time.Second)
	defer cancelOpen()
	pool, err := pgdb.Open(openCtx, pg.URL(), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgdb.Migrate(pg.URL()); err != nil {
		t.Fatal(err)
	}
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	reg := prometheus.NewRegistry()
	rdb := testenv.Redis(t)
	listenCtx, stopListen := context.WithCancel(ctx)
	t.Cleanup(stopListen)
	// The production TTLs (30 s for orgs and users, 5 s for keys): every entry
	// expires during the outage, so the stale-on-error path serves them.
	cache := tenants.NewCache(svc, tenants.CacheOptions{Logger: log, Metrics: cachemetrics.New(reg)})
	cache.Listen(listenCtx, rdb)
	usage := billing.NewStore(pool)
	prefix := testenv.ID(t, "pgdown")
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: testRedisTimeout,
		Registerer: reg, Engine: quota.Config{KeyPrefix: prefix, Hydrator: usage.Ledger()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = router.Close()
		if ks, err := rdb.Keys(context.Background(), prefix+":*").Result(); err == nil && len(ks) > 0 {
			rdb.Del(context.Background(), ks...)
		}
	})
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Cache: cache, Checker: router, Redis: rdb, Registry: reg,
		AdminToken: operatorToken, Logger: log,
		Billing:  &billing.Service{Store: usage, Tenants: svc, Logger: log, Counters: ledger.EngineCounters(router)},
		Webhooks: &webhooks.Service{Store: webhooks.NewStore(pool), Tenants: svc}})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, h: h, pool: pool, svc: svc, tokens: map[string]string{"operator": operatorToken}}
	r := &replica{f: f}

	// Orgs on a plan whose limits the load never reaches, so every normal answer is 200.
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"big","name":"Big","fail_mode":"closed","limits":[{"metric":"requests","window":"minute","limit":1000000},{"metric":"requests","window":"month","limit":100000000}]}`, 201)
	keys := map[string]string{}
	// acme and globex take the checks and the admin calls of the outage; initech the
	// team creates that race the crash. Their ids are unique: the cache listens on
	// the shared Redis's invalidation channel, where other tests announce changes of
	// their own orgs named "acme".
	acme, globex, initech := testenv.ID(t, "acme"), testenv.ID(t, "globex"), testenv.ID(t, "initech")
	for _, org := range []string{acme, globex, initech} {
		r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"`+org+`","name":"O","plan":"big"}`, 201)
		r.mustDo("POST", "/v1/orgs/"+org+"/teams", operatorToken, `{"id":"eng","name":"Eng","limits":[{"metric":"requests","window":"month","limit":1000000}],"user_limits":[{"metric":"requests","window":"month","limit":100000}]}`, 201)
		for _, scope := range []string{"check", "admin"} {
			var k api.ApiKeyCreated
			_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/"+org+"/api-keys", operatorToken, `{"name":"k","scopes":["`+scope+`"]}`, 201)), &k)
			keys[org+"-"+scope] = k.Secret
		}
	}
	r.mustDo("POST", "/v1/orgs/"+acme+"/teams/eng/users", operatorToken, `{"id":"alice"}`, 201)

	// The checks of the load: a registered user, unregistered users of a team, a team.
	type check struct{ key, body string }
	var checks []check
	checks = append(checks, check{keys[acme+"-check"], `{"org":"` + acme + `","team":"eng","user":"alice"}`})
	for i := range workers {
		checks = append(checks, check{keys[acme+"-check"], fmt.Sprintf(`{"org":%q,"team":"eng","user":"u%d"}`, acme, i)})
	}
	checks = append(checks, check{keys[globex+"-check"], `{"org":"` + globex + `","team":"eng"}`})
	for _, c := range checks { // warm-up: each org, user and key used once
		if got := r.check(c.key, c.body); got.code != 200 {
			t.Fatalf("warm-up check %s = %d %s", c.body, got.code, got.raw)
		}
	}
	if rec := f.do("GET", "/readyz", "", ""); rec.Code != 200 {
		t.Fatalf("/readyz before the outage = %d %s", rec.Code, rec.Body)
	}

	// The load: workers check back to back (2 ms apart) until stopped.
	type answer struct {
		at     time.Time
		took   time.Duration
		normal bool // 200, allowed by Redis, not degraded
		code   int
		raw    string
	}
	var (
		wg      sync.WaitGroup
		stop    = make(chan struct{})
		answers [workers][]answer
	)
	for w := range workers {
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				c := checks[i%len(checks)]
				t0 := time.Now()
				got := r.check(c.key, c.body)
				a := answer{at: t0, took: time.Since(t0), code: got.code,
					normal: got.code == 200 && got.body.Allowed && got.body.Degraded == nil}
				if !a.normal {
					a.raw = got.raw
				}
				answers[w] = append(answers[w], a)
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	t.Cleanup(stopLoad)

	// Team creates back to back across the crash: one is likely in flight when the
	// backends die. Each must end absent or complete, and answer 201 or 503.
	type attempt struct {
		org, id string
		code    int // the status answered
	}
	var (
		creates  []attempt
		raceMu   sync.Mutex
		raceOdd  []string
		racing   = make(chan struct{})
		raced    sync.WaitGroup
		teamBody = func(id string) string {
			return `{"id":"` + id + `","name":"T","limits":[{"metric":"requests","window":"month","limit":10},{"metric":"requests","window":"minute","limit":5}],"user_limits":[{"metric":"requests","window":"day","limit":3}]}`
		}
	)
	for g := range 2 {
		raced.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-racing:
					return
				default:
				}
				id := fmt.Sprintf("race-%d-%d", g, i)
				rec := f.do("POST", "/v1/orgs/"+initech+"/teams", keys[initech+"-admin"], teamBody(id))
				raceMu.Lock()
				creates = append(creates, attempt{initech, id, rec.Code})
				if rec.Code != 201 && rec.Code != 503 {
					raceOdd = append(raceOdd, fmt.Sprintf("%s: %d %s", id, rec.Code, strings.TrimSpace(rec.Body.String())))
				}
				raceMu.Unlock()
			}
		})
	}
	time.Sleep(500 * time.Millisecond)

	// The outage.
	stopAt := time.Now()
	pg.crash(t)
	stopped := time.Now()
	time.Sleep(300 * time.Millisecond)
	close(racing)
	raced.Wait()

	// Admin calls every 2 s: each answers 503 problem+json within adminBound.
	var calls []apiCall
	call := func(what, method, path, token, body string) {
		t0 := time.Now()
		rec := f.do(method, path, token, body)
		t1 := time.Now()
		c := apiCall{what: what, code: rec.Code, ctype: rec.Header().Get("Content-Type"), took: t1.Sub(t0), ran: stalls.Running(t0, t1)}
		var p struct{ Detail string }
		_ = json.Unmarshal(rec.Body.Bytes(), &p)
		c.detail = p.Detail
		if path == "/readyz" {
			c.detail = strings.TrimSpace(rec.Body.String())
		}
		calls = append(calls, c)
	}
	for n := 0; time.Since(stopAt) < outage-2*time.Second; n++ {
		id := fmt.Sprintf("down-%d", n)
		call("create team (org key)", "POST", "/v1/orgs/"+acme+"/teams", keys[acme+"-admin"], teamBody(id))
		creates = append(creates, attempt{acme, id, calls[len(calls)-1].code})
		call("list teams (org key)", "GET", "/v1/orgs/"+acme+"/teams", keys[acme+"-admin"], "")
		call("list teams (operator)", "GET", "/v1/orgs/"+globex+"/teams", operatorToken, "")
		call("patch team (operator)", "PATCH", "/v1/orgs/"+globex+"/teams/eng", operatorToken, `{"name":"Engineering"}`)
		call("readiness", "GET", "/readyz", "", "")
		time.Sleep(2 * time.Second)
	}
	time.Sleep(time.Until(stopAt.Add(outage)))
	startAt := time.Now()
	pg.start(t)
	started := time.Now()

	// Back: readiness sees Postgres and the admin API answers again, within 10 s of the start.
	var ready time.Duration
	for {
		if rec := f.do("GET", "/readyz", "", ""); rec.Code == 200 && strings.Contains(rec.Body.String(), `"postgres":"ok"`) {
			ready = time.Since(started)
			break
		}
		if time.Since(started) > 10*time.Second {
			t.Fatalf("/readyz still without postgres ok 10s after Postgres started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	list := r.mustDo("GET", "/v1/orgs/"+acme+"/teams?limit=100", keys[acme+"-admin"], "", 200)
	r.mustDo("POST", "/v1/orgs/"+acme+"/teams", keys[acme+"-admin"], teamBody("after"), 201)
	r.mustDo("PATCH", "/v1/orgs/"+globex+"/teams/eng", operatorToken, `{"name":"Engineering"}`, 200)
	time.Sleep(500 * time.Millisecond)
	stopLoad()

	// Checks: at least 99.9 % answered normally (200, allowed by Redis, not degraded),
	// overall and within the outage.
	var total, normal, outTotal, outNormal int
	var outLat []time.Duration
	var odd []string
	for _, as := range answers {
		for _, a := range as {
			inOutage := !a.at.Before(stopAt) && a.at.Before(startAt)
			total++
			if inOutage {
				outTotal++
				outLat = append(outLat, a.took)
			}
			if a.normal {
				normal++
				if inOutage {
					outNormal++
				}
			} else if len(odd) < 5 {
				odd = append(odd, fmt.Sprintf("%d at +%v: %s", a.code, a.at.Sub(stopAt).Round(time.Millisecond), a.raw))
			}
		}
	}
	if outTotal < 1000 {
		t.Fatalf("only %d checks during the outage: the load is too thin to mean anything", outTotal)
	}
	if float64(normal) < normalShare*float64(total) || float64(outNormal) < normalShare*float64(outTotal) {
		t.Errorf("checks answered normally: %d of %d, %d of %d during the outage; want >= %.1f%%; first others: %s",
			normal, total, outNormal, outTotal, 100*normalShare, strings.Join(odd, "; "))
	}

	// Admin calls during the outage: 503 problem+json, saying why, within adminBound.
	var slowest, slowestRaw time.Duration
	for _, c := range calls {
		slowest, slowestRaw = max(slowest, c.ran), max(slowestRaw, c.took)
		switch {
		case c.what == "readiness": // still ready: checks run on cached limits
			if c.code != 200 || !strings.Contains(c.detail, `"postgres":"unreachable"`) || !strings.Contains(c.detail, `"status":"degraded"`) {
				t.Errorf("/readyz during the outage = %d %s; want 200, degraded, postgres unreachable", c.code, c.detail)
			}
		case c.code != 503 || c.ctype != "application/problem+json" || !strings.Contains(c.detail, "database is unavailable"):
			t.Errorf("%s during the outage = %d %s %q; want 503 problem+json saying the database is unavailable", c.what, c.code, c.ctype, c.detail)
		}
		if c.ran > adminBound {
			t.Errorf("%s during the outage took %v (%v with stalls), want <= %v", c.what, c.ran, c.took, adminBound)
		}
	}

	// No partial writes: each team attempted is absent or complete (its row, 2 team
	// limits, 1 user default, 1 audit row); each org has one team.create audit row per team.
	if len(raceOdd) > 0 {
		t.Errorf("team creates racing the crash answered other than 201 or 503: %s", strings.Join(raceOdd, "; "))
	}
	var absent, complete []string
	lostReplies := 0 // complete, but answered 503: committed as the connection died
	orgs, ids := make([]string, len(creates)), make([]string, len(creates))
	for i, a := range creates {
		orgs[i], ids[i] = a.org, a.id
	}
	found := map[attempt][4]int{}
	rows, err := pool.Query(ctx, `SELECT a.org, a.id,
		(SELECT count(*) FROM teams WHERE org_id = a.org AND id = a.id),
		(SELECT count(*) FROM team_limits WHERE org_id = a.org AND team_id = a.id AND kind = 'team'),
		(SELECT count(*) FROM team_limits WHERE org_id = a.org AND team_id = a.id AND kind = 'user_default'),
		(SELECT count(*) FROM audit_log WHERE org_id = a.org AND action = 'team.create' AND object = 'team:' || a.id)
		FROM unnest($1::text[], $2::text[]) AS a(org, id)`, orgs, ids)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a attempt
		var n [4]int
		if err := rows.Scan(&a.org, &a.id, &n[0], &n[1], &n[2], &n[3]); err != nil {
			t.Fatal(err)
		}
		found[a] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, a := range creates {
		n := found[attempt{org: a.org, id: a.id}] // team rows, team limits, user defaults, audit rows
		switch n {
		case [4]int{0, 0, 0, 0}:
			absent = append(absent, a.id)
			if a.code == 201 {
				t.Errorf("team %s was answered 201 but is gone after the crash", a.id)
			}
		case [4]int{1, 2, 1, 1}:
			complete = append(complete, a.id)
			if a.org == acme {
				t.Errorf("team %s was created while Postgres was down", a.id)
			}
			if a.code != 201 {
				lostReplies++
			}
		default:
			t.Errorf("team %s of %s is half written: %d team rows, %d limits, %d user defaults, %d audit rows",
				a.id, a.org, n[0], n[1], n[2], n[3])
		}
	}
	rows, err = pool.Query(ctx, `SELECT o.id,
		(SELECT count(*) FROM teams t WHERE t.org_id = o.id),
		(SELECT count(*) FROM audit_log a WHERE a.org_id = o.id AND a.action = 'team.create')
		FROM orgs o ORDER BY o.id`)
	if err != nil {
		t.Fatal(err)
	}
	perOrg := map[string][2]int{}
	for rows.Next() {
		var org string
		var teams, audits int
		if err := rows.Scan(&org, &teams, &audits); err != nil {
			t.Fatal(err)
		}
		perOrg[org] = [2]int{teams, audits}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// acme: eng and "after"; globex: eng; initech: eng and the complete race creates.
	want := map[string][2]int{acme: {2, 2}, globex: {1, 1}, initech: {1 + len(complete), 1 + len(complete)}}
	if !maps.Equal(perOrg, want) {
		t.Errorf("teams and team.create audit rows per org = %v, want %v", perOrg, want)
	}
	// The list right after the restart: eng alone, none of the creates of the outage.
	var listed api.TeamList
	if err := json.Unmarshal([]byte(list), &listed); err != nil || len(listed.Items) != 1 || listed.Items[0].Id != "eng" {
		t.Errorf("acme's teams after the restart = %s (%v), want eng alone", list, err)
	}

	if t.Failed() {
		t.Logf("api log (tail):\n%s", tail(logs.String(), 40))
	}

	slices.Sort(outLat)
	t.Logf("Postgres down %v (pg_ctl stop -m immediate took %v): %d checks during it, %d answered normally (%.3f%%), p99 %v, slowest %v; %d checks in all, %d normal",
		startAt.Sub(stopAt).Round(time.Millisecond), stopped.Sub(stopAt).Round(time.Millisecond), outTotal, outNormal,
		100*float64(outNormal)/float64(outTotal), outLat[len(outLat)*99/100].Round(10*time.Microsecond),
		outLat[len(outLat)-1].Round(time.Millisecond), total, normal)
	longest, nstalls := stalls.Longest()
	t.Logf("%d admin calls during the outage, all 503 problem+json (readiness 503), slowest %v (%v with stalls); ready %v after the start; process stalls (>= %v): %d, longest %v",
		len(calls), slowest.Round(time.Millisecond), slowestRaw.Round(time.Millisecond), ready.Round(time.Millisecond),
		testenv.StallMin, nstalls, longest.Round(time.Millisecond))
	t.Logf("team creates attempted: %d complete (%d of them answered 503: committed as the connection died), %d absent (%d made during the outage); teams = team.create audit rows per org: %v",
		len(complete), lostReplies, len(absent), len(calls)/5, perOrg)
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
