package rls_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/rls"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

const operatorToken = "rls-test-operator-token"

// replica is one api process: its own pool, cache, engine, HTTP handler and gRPC
// server on a real loopback listener, over the shared Postgres database and Redis.
type replica struct {
	t      *testing.T
	h      http.Handler
	client rlsv3.RateLimitServiceClient
	conn   *grpc.ClientConn
}

func newReplica(t *testing.T, dbURL, prefix string) *replica {
	t.Helper()
	return newReplicaWith(t, dbURL, prefix, replicaOptions{})
}

// replicaOptions are what some tests change of a replica.
type replicaOptions struct {
	tp      trace.TracerProvider              // the engine's, HTTP's and gRPC's spans; nil: none
	grpcReg prometheus.Registerer             // the gRPC server's metrics; nil: none
	engine  func(checks.Engine) checks.Engine // wraps the gRPC server's engine; nil: the router
	headers checks.HeaderMode                 // the gRPC server's RateLimit header fields
	rlqs    rls.RLQSLimits                    // the rate limit quota service's bounds
}

// newReplicaWith is newReplica with opts.
func newReplicaWith(t *testing.T, dbURL, prefix string, opts replicaOptions) *replica {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc := tenants.NewService(pool, tenants.WithPasswordCost(64, 1))
	rdb := testenv.Redis(t)
	// The replicas of one test share an invalidation channel no other test uses.
	cache := tenants.NewCache(svc, tenants.CacheOptions{TTL: time.Hour, KeyTTL: time.Hour,
		Channel: tenants.InvalidationChannel + ":" + prefix})
	cache.Listen(ctx, rdb)
	reg := prometheus.NewRegistry()
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: testenv.RedisURL(t), RedisTimeout: 2 * time.Second,
		Engine: quota.Config{KeyPrefix: prefix, TracerProvider: opts.tp}, Breaker: quota.BreakerConfig{OpenTimeout: 200 * time.Millisecond}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = router.Close() })
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	h, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Cache: cache, Checker: router, Redis: rdb, Registry: reg,
		AdminToken: operatorToken, Logger: log, TracerProvider: opts.tp})
	if err != nil {
		t.Fatal(err)
	}
	var engine checks.Engine = router
	if opts.engine != nil {
		engine = opts.engine(router)
	}
	g, _ := rls.NewServer(rls.Deps{Cache: cache, Checker: engine, Aliases: map[string]string{"x-user-id": "user"}, Logger: log,
		Registerer: opts.grpcReg, TracerProvider: opts.tp, RateLimitHeaders: opts.headers, RLQS: opts.rlqs})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &replica{t: t, h: h, client: rlsv3.NewRateLimitServiceClient(conn), conn: conn}
}

func (r *replica) do(method, path, token, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	r.h.ServeHTTP(rec, req)
	return rec
}

func (r *replica) mustDo(method, path, body string, want int) string {
	r.t.Helper()
	rec := r.do(method, path, operatorToken, body)
	if rec.Code != want {
		r.t.Fatalf("%s %s = %d, want %d: %s", method, path, rec.Code, want, rec.Body)
	}
	return rec.Body.String()
}

func (r *replica) key(org string, scopes string) string {
	r.t.Helper()
	var k api.ApiKeyCreated
	_ = json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/"+org+"/api-keys", `{"name":"k","scopes":[`+scopes+`]}`, 201)), &k)
	return k.Secret
}

// setup creates, through the HTTP API, a plan (10000/minute, 1000/month, failing
// closed), an org on it, teams eng and ops of 60/month each whose users may use
// userMonth a month, and a key with the check scope.
func (r *replica) setup(org string, userMonth int) (checkKey string) {
	r.mustDo("POST", "/v1/plans", `{"id":"p-`+org+`","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"minute","limit":10000},{"metric":"requests","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	for _, team := range []string{"eng", "ops"} {
		r.mustDo("POST", "/v1/orgs/"+org+"/teams", fmt.Sprintf(`{"id":"%s","name":"T","limits":[{"metric":"requests","window":"month","limit":60}],"user_limits":[{"metric":"requests","window":"month","limit":%d}]}`, team, userMonth), 201)
	}
	return r.key(org, `"check"`)
}

// used reads the month usage of a team (user "") or user through a cost-0 HTTP check.
func (r *replica) used(key, org, team, user string) int64 {
	r.t.Helper()
	body := fmt.Sprintf(`{"org":%q,"team":%q,"cost":0}`, org, team)
	want := vocab.LevelTeam
	if user != "" {
		body = fmt.Sprintf(`{"org":%q,"team":%q,"user":%q,"cost":0}`, org, team, user)
		want = vocab.LevelUser
	}
	rec := r.do("POST", "/v1/check", key, body)
	var res api.CheckResult
	if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || rec.Code != 200 && rec.Code != 429 {
		r.t.Fatalf("usage check = %d %s", rec.Code, rec.Body)
	}
	for _, l := range res.Levels {
		if string(l.Level) == string(want) && l.Window == "month" {
			return l.Used
		}
	}
	r.t.Fatalf("no %s month level in %s", want, rec.Body)
	return 0
}

type entry struct{ k, v string }

func desc(es ...entry) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, e := range es {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.k, Value: e.v})
	}
	return d
}

func withCost(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func (r *replica) should(key string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	ctx := context.Background()
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+key)
	}
	return r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds, HitsAddend: hits})
}

func (r *replica) mustShould(key string, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	r.t.Helper()
	res, err := r.should(key, hits, ds...)
	if err != nil {
		r.t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(res.GetStatuses()) != len(ds) {
		r.t.Fatalf("%d statuses for %d descriptors", len(res.GetStatuses()), len(ds))
	}
	return res
}

func headerOf(res *rlsv3.RateLimitResponse, name string) string {
	for _, h := range res.GetResponseHeadersToAdd() {
		if h.GetKey() == name {
			return h.GetValue()
		}
	}
	return ""
}

// 64 concurrent streams over 2 replicas, each call a team and a user descriptor of
// one path: the team's 60 a month and each user's 25 hold exactly, and denied calls
// count nothing at any level.
func TestExactCascadeUnder64StreamsOnTwoReplicas(t *testing.T) {
	db, prefix := testenv.PostgresURL(t), testenv.ID(t, "r")
	a, b := newReplica(t, db, prefix), newReplica(t, db, prefix)
	key := a.setup("acme", 25)
	users := []string{"alice", "bob", "carol"}
	const streams, perStream = 64, 5
	var mu sync.Mutex
	allowed := map[string]int64{}
	denied := 0
	var wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := []*replica{a, b}[i%2]
			user := users[i%len(users)]
			for range perStream {
				res, err := r.should(key, 0, desc(entry{"team", "eng"}), desc(entry{"team", "eng"}, entry{"user", user}))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if res.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					allowed[user]++
				} else {
					denied++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var total int64
	for _, u := range users {
		if allowed[u] > 25 {
			t.Errorf("user %s: %d allowed over a cap of 25", u, allowed[u])
		}
		if got := b.used(key, "acme", "eng", u); got != allowed[u] {
			t.Errorf("user %s: used %d, but %d calls were allowed", u, got, allowed[u])
		}
		total += allowed[u]
	}
	if total != 60 || denied != streams*perStream-60 {
		t.Errorf("allowed %d (want the team's 60), denied %d", total, denied)
	}
	if got := a.used(key, "acme", "eng", ""); got != 60 {
		t.Errorf("team used %d, want 60: a denied call counted", got)
	}
}

// Descriptors on one path are one check: when the user's limit refuses, the team's
// descriptor, which had room, counts nothing either. Descriptors on different paths
// are decided each on its own. The answer carries the HTTP check's headers.
func TestOnePathIsAllOrNothing(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 3)
	team, alice := desc(entry{"team", "eng"}), desc(entry{"team", "eng"}, entry{"x-user-id", "alice"})
	for i := range 3 {
		res := r.mustShould(key, 0, team, alice)
		if res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v", i, res)
		}
	}
	res := r.mustShould(key, 0, team, alice)
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("4th call over alice's 3: %v", res)
	}
	for i, st := range res.GetStatuses() {
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("status %d = %v, want OVER_LIMIT: the path was refused as a whole", i, st)
		}
	}
	// alice's status: her own month limit, spent.
	if cl := res.GetStatuses()[1].GetCurrentLimit(); cl.GetRequestsPerUnit() != 3 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MONTH ||
		res.GetStatuses()[1].GetLimitRemaining() != 0 || res.GetStatuses()[1].GetDurationUntilReset().AsDuration() <= 0 {
		t.Errorf("alice's status = %v", res.GetStatuses()[1])
	}
	// The team's status describes the team and the org: 60 a month, 57 left.
	if cl := res.GetStatuses()[0].GetCurrentLimit(); cl.GetRequestsPerUnit() != 60 || res.GetStatuses()[0].GetLimitRemaining() != 57 {
		t.Errorf("team's status = %v", res.GetStatuses()[0])
	}
	if got := r.used(key, "acme", "eng", ""); got != 3 {
		t.Errorf("team used %d after alice's refusal, want 3", got)
	}
	// The same headers as the HTTP check's 429.
	rec := r.do("POST", "/v1/check", key, `{"org":"acme","team":"eng","user":"alice"}`)
	if rec.Code != 429 {
		t.Fatalf("HTTP check = %d %s", rec.Code, rec.Body)
	}
	for _, h := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After"} {
		want, got := rec.Header()[h], headerOf(res, h)
		if len(want) != 1 || got == "" {
			t.Errorf("%s: HTTP %q, gRPC %q", h, want, got)
			continue
		}
		w, _ := strconv.Atoi(want[0])
		g, _ := strconv.Atoi(got)
		if d := w - g; d < -1 || d > 1 { // a second may pass between the two
			t.Errorf("%s: HTTP %q, gRPC %q", h, want[0], got)
		}
	}

	// Different paths: bob's check is decided on its own and counted.
	bob := desc(entry{"team", "eng"}, entry{"user", "bob"})
	res = r.mustShould(key, 0, alice, bob)
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || res.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
		res.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("alice and bob: %v", res)
	}
	if got := r.used(key, "acme", "eng", "bob"); got != 1 {
		t.Errorf("bob used %d, want 1", got)
	}
	if got := r.used(key, "acme", "eng", ""); got != 4 {
		t.Errorf("team used %d, want 4 (3 of alice's, 1 of bob's)", got)
	}
	if headerOf(res, "Retry-After") == "" || headerOf(res, "RateLimit-Remaining") != "0" {
		t.Errorf("a refused path's headers: %v", res.GetResponseHeadersToAdd())
	}
}

// The cost is the descriptor's hits_addend, else the request's, else 1; merged
// descriptors count their path once, with the largest cost.
func TestHitsAddendIsTheCost(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 50)
	steps := []struct {
		name  string
		hits  uint32
		ds    []*ratelimitv3.RateLimitDescriptor
		alice int64 // alice's usage after the step
	}{
		{"default 1", 0, []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", "eng"}, entry{"user", "alice"})}, 1},
		{"request's hits_addend", 5, []*ratelimitv3.RateLimitDescriptor{desc(entry{"team", "eng"}, entry{"user", "alice"})}, 6},
		{"descriptor's overrides the request's", 7, []*ratelimitv3.RateLimitDescriptor{withCost(desc(entry{"team", "eng"}, entry{"user", "alice"}), 2)}, 8},
		{"descriptor's 0 queries", 7, []*ratelimitv3.RateLimitDescriptor{withCost(desc(entry{"team", "eng"}, entry{"user", "alice"}), 0)}, 8},
		{"merged: the largest, once", 0, []*ratelimitv3.RateLimitDescriptor{withCost(desc(entry{"team", "eng"}), 3),
			withCost(desc(entry{"team", "eng"}, entry{"user", "alice"}), 2), desc(entry{"metric", "requests"})}, 11},
	}
	for _, s := range steps {
		res := r.mustShould(key, s.hits, s.ds...)
		if res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v", s.name, res)
		}
		if got := r.used(key, "acme", "eng", "alice"); got != s.alice {
			t.Errorf("%s: alice used %d, want %d", s.name, got, s.alice)
		}
		if got := r.used(key, "acme", "eng", ""); got != s.alice {
			t.Errorf("%s: team used %d, want %d", s.name, got, s.alice)
		}
	}
	// A cost over what is left is refused and counts nothing.
	res := r.mustShould(key, 40, desc(entry{"team", "eng"}, entry{"user", "alice"}))
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || r.used(key, "acme", "eng", "alice") != 11 {
		t.Errorf("cost 40 over the 39 left: %v", res)
	}
}

// The errors a call may meet: the key's (no key, a bad one, one without the check
// scope) and a call without descriptors, each with a message that says what to fix.
// A descriptor that names no check is no error (TestUndecidableDescriptorsAreRefusedAlone);
// nor are more descriptors than a call may carry: every one is OVER_LIMIT, and
// nothing is counted.
func TestErrors(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 50)
	admin := r.key("acme", `"admin"`)
	eng := desc(entry{"team", "eng"})
	cases := []struct {
		name string
		key  string
		ds   []*ratelimitv3.RateLimitDescriptor
		code codes.Code
		msg  string
	}{
		{"no key", "", []*ratelimitv3.RateLimitDescriptor{eng}, codes.Unauthenticated, "authorization: Bearer"},
		{"unknown key", "qp_nope", []*ratelimitv3.RateLimitDescriptor{eng}, codes.Unauthenticated, "invalid, unknown or revoked"},
		{"key without check", admin, []*ratelimitv3.RateLimitDescriptor{eng}, codes.PermissionDenied, "check"},
		{"no descriptors", key, nil, codes.InvalidArgument, "1 to 100 descriptors"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.should(tc.key, 0, tc.ds...)
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Errorf("= %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
	many := make([]*ratelimitv3.RateLimitDescriptor, rls.MaxDescriptors+1)
	for i := range many {
		many[i] = desc(entry{"team", "eng"})
	}
	res := r.mustShould(key, 0, many...)
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || !strings.Contains(headerOf(res, "Quotaplane-Refused"), "at most 100 descriptors") {
		t.Errorf("101 descriptors: %v, want OVER_LIMIT saying at most 100", res.GetOverallCode())
	}
	for i, st := range res.GetStatuses() {
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("descriptor %d of 101 = %v, want OVER_LIMIT", i, st)
		}
	}
	if got := r.used(key, "acme", "eng", ""); got != 0 {
		t.Errorf("team used %d after refused calls, want 0", got)
	}
}

// Shadow and warn never answer OVER_LIMIT, and count; warn says so in a header.
func TestShadowAndWarnAnswerOKAndCount(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 2)
	alice := desc(entry{"team", "eng"}, entry{"user", "alice"})
	r.mustDo("PATCH", "/v1/orgs/acme", `{"mode":"shadow"}`, 200)
	for i := range 4 {
		if res := r.mustShould(key, 0, alice); res.GetOverallCode() != rlsv3.RateLimitResponse_OK || headerOf(res, "Retry-After") != "" {
			t.Fatalf("shadow call %d: %v", i, res)
		}
	}
	if got := r.used(key, "acme", "eng", "alice"); got != 4 {
		t.Errorf("shadow: alice used %d, want 4 (over her 2: counted anyway)", got)
	}
	r.mustDo("PATCH", "/v1/orgs/acme", `{"mode":"warn"}`, 200)
	res := r.mustShould(key, 0, alice)
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OK || !strings.Contains(headerOf(res, "Quotaplane-Warning"), "warn mode") {
		t.Errorf("warn: %v", res)
	}
	if got := r.used(key, "acme", "eng", "alice"); got != 5 {
		t.Errorf("warn: alice used %d, want 5", got)
	}
	r.mustDo("PATCH", "/v1/orgs/acme", `{"mode":"enforce"}`, 200)
	if res := r.mustShould(key, 0, alice); res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("enforce: %v", res)
	}
}

// With the org's Redis down: a closed plan answers UNAVAILABLE (so Envoy's
// failure_mode_deny decides), an open one OK and degraded, a local one decides in
// the replica, degraded.
func TestRedisDownUnderEachFailMode(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 2)
	alice := desc(entry{"team", "eng"}, entry{"user", "alice"})
	r.mustDo("PATCH", "/v1/orgs/acme", `{"redis_url":"redis://127.0.0.1:1/0","redis_url_check":false}`, 200) // nothing listens there
	for i := range 5 {
		_, err := r.should(key, 0, alice)
		if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "unavailable") {
			t.Fatalf("closed, call %d: %v", i, err)
		}
	}
	r.mustDo("PATCH", "/v1/plans/p-acme", `{"fail_mode":"open"}`, 200)
	for i := range 3 {
		res := r.mustShould(key, 0, alice)
		if res.GetOverallCode() != rlsv3.RateLimitResponse_OK || headerOf(res, "Quotaplane-Degraded") != "true" {
			t.Fatalf("open, call %d: %v", i, res)
		}
	}
	r.mustDo("PATCH", "/v1/plans/p-acme", `{"fail_mode":"local"}`, 200)
	codesSeen := map[rlsv3.RateLimitResponse_Code]int{}
	for range 4 {
		res := r.mustShould(key, 0, alice)
		if headerOf(res, "Quotaplane-Degraded") != "true" {
			t.Errorf("local: not degraded: %v", res)
		}
		codesSeen[res.GetOverallCode()]++
	}
	if codesSeen[rlsv3.RateLimitResponse_OK] != 2 || codesSeen[rlsv3.RateLimitResponse_OVER_LIMIT] != 2 {
		t.Errorf("local, alice's 2 a month on one replica: %v", codesSeen)
	}
}

// Hostile hits_addend values: 2^53 and just past vocab.MaxUnits (2^50) are refused,
// whatever the mode: the descriptor is OVER_LIMIT for itself, counting nothing, and
// Quotaplane-Refused names hits_addend and the bound in the words of the HTTP API; the
// call's other path ([team=ops]) is decided and counted. The bound itself is decided
// (over the limit). Afterwards the org's calls answer OK; no such value is taken as a
// cost, nor counted in shadow mode.
func TestHostileHitsAddendIsRefused(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := r.setup("acme", 50)
	shadowKey := r.setup("shade", 50)
	r.mustDo("PATCH", "/v1/orgs/shade", `{"mode":"shadow"}`, 200)
	alice := func() *ratelimitv3.RateLimitDescriptor { return desc(entry{"team", "eng"}, entry{"user", "alice"}) }
	for _, k := range []string{key, shadowKey} {
		for _, n := range []uint64{1 << 53, uint64(vocab.MaxUnits) + 1, 1<<64 - 1} {
			res := r.mustShould(k, 0, desc(entry{"team", "ops"}), withCost(alice(), n))
			if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || res.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OK ||
				res.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
				!strings.Contains(headerOf(res, "Quotaplane-Refused"), "descriptor 1 (team=eng, user=alice): hits_addend: must be 0 to 1125899906842624") {
				t.Errorf("hits_addend %d = %v, want OVER_LIMIT for it alone, naming hits_addend and the bound", n, res)
			}
		}
	}
	if res := r.mustShould(key, 0, withCost(alice(), uint64(vocab.MaxUnits))); res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("hits_addend at the bound: %v, want OVER_LIMIT", res)
	}
	for org, k := range map[string]string{"acme": key, "shade": shadowKey} {
		if got := r.used(k, org, "eng", "alice"); got != 0 {
			t.Errorf("%s: alice used %d after refused descriptors, want 0", org, got)
		}
		if got := r.used(k, org, "ops", ""); got != 3 {
			t.Errorf("%s: ops used %d, want 3 (decided beside each refused descriptor)", org, got)
		}
		if res := r.mustShould(k, 0, alice()); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("%s: a call after the hostile ones: %v", org, res)
		}
		if got := r.used(k, org, "eng", "alice"); got != 1 {
			t.Errorf("%s: alice used %d, want 1", org, got)
		}
	}
}

// Descriptors of one path that differ only in metric are one multi-metric decision:
// when the tokens do not fit, the request is refused with them and counted nowhere.
func TestMetricsOfOnePathAreAllOrNothing(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	r.mustDo("POST", "/v1/plans", `{"id":"pm","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":1000},{"metric":"tokens","window":"month","limit":100}]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"acme","name":"O","plan":"pm"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", `{"id":"eng","name":"T"}`, 201)
	key := r.key("acme", `"check"`)
	usedOf := func(metric string) int64 {
		t.Helper()
		rec := r.do("POST", "/v1/check", key, `{"org":"acme","team":"eng","user":"alice","metric":"`+metric+`","cost":0}`)
		var res api.CheckResult
		if err := json.Unmarshal(rec.Body.Bytes(), &res); err != nil || len(res.Levels) == 0 {
			t.Fatalf("usage check = %d %s", rec.Code, rec.Body)
		}
		return res.Levels[0].Used
	}
	call := func() *rlsv3.RateLimitResponse {
		return r.mustShould(key, 0, desc(entry{"team", "eng"}, entry{"user", "alice"}, entry{"metric", "requests"}),
			withCost(desc(entry{"team", "eng"}, entry{"user", "alice"}, entry{"metric", "tokens"}), 60))
	}
	if res := call(); res.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first call: %v", res)
	}
	res := call()
	if res.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("120 tokens over 100: %v", res)
	}
	for i, st := range res.GetStatuses() {
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("status %d = %v, want OVER_LIMIT: the metrics were refused together", i, st)
		}
	}
	// each descriptor's status describes its own metric
	if cl := res.GetStatuses()[0].GetCurrentLimit(); cl.GetRequestsPerUnit() != 1000 {
		t.Errorf("requests' status = %v", res.GetStatuses()[0])
	}
	if cl := res.GetStatuses()[1].GetCurrentLimit(); cl.GetRequestsPerUnit() != 100 {
		t.Errorf("tokens' status = %v", res.GetStatuses()[1])
	}
	if got := usedOf("requests"); got != 1 {
		t.Errorf("requests used %d, want 1: the refused call's request was counted", got)
	}
	if got := usedOf("tokens"); got != 60 {
		t.Errorf("tokens used %d, want 60", got)
	}
}
