package rls_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/loadgen"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/rls"
)

// The proxies are loadgen.Proxy: Envoy's rate_limit_quota filter at its worst for a
// quota, on go-control-plane's generated RLQS client (a fresh full bucket on every
// assignment, for its whole TTL from its arrival; nothing before the first or after
// expiry), reporting every simInterval.

const simInterval = 100 * time.Millisecond

// startProxy opens a proxy's stream with key, offering rate requests a second to each
// bucket; it is cut when the test ends.
func startProxy(t *testing.T, r *replica, key string, rate float64, ids ...map[string]string) *loadgen.Proxy {
	t.Helper()
	var bs []loadgen.ProxyBucket
	for _, id := range ids {
		bs = append(bs, loadgen.ProxyBucket{ID: id, Rate: rate})
	}
	p, err := loadgen.StartProxy(r.conn, key, simInterval, bs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Cut()
		if f := p.Stats().Faults; len(f) > 0 {
			t.Errorf("the proxy met %v", f)
		}
	})
	return p
}

// setupRLQS creates an org whose users may use userMonth requests a month, and whose
// team eng has teamMinute a minute when not 0, and returns a key with the check scope.
func setupRLQS(r *replica, org string, userMonth, teamMinute int) string {
	r.mustDo("POST", "/v1/plans", `{"id":"p-`+org+`","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":1000000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", `{"id":"`+org+`","name":"O","plan":"p-`+org+`"}`, 201)
	team := ""
	if teamMinute > 0 {
		team = fmt.Sprintf(`"limits":[{"metric":"requests","window":"minute","limit":%d}],`, teamMinute)
	}
	r.mustDo("POST", "/v1/orgs/"+org+"/teams", fmt.Sprintf(`{"id":"eng","name":"T",%s"user_limits":[{"metric":"requests","window":"month","limit":%d}]}`, team, userMonth), 201)
	return r.key(org, `"check"`)
}

// runUntilStill lets the proxies run until none admitted anything for quiet (at most
// max), then stops their offering and lets them report for a while more.
func runUntilStill(ps []*loadgen.Proxy, quiet, max time.Duration) {
	start, last, lastN := time.Now(), time.Now(), int64(-1)
	for time.Since(start) < max {
		time.Sleep(20 * time.Millisecond)
		var n int64
		for _, p := range ps {
			n += p.Stats().Admitted
		}
		if n != lastN {
			last, lastN = time.Now(), n
		} else if time.Since(last) > quiet {
			break
		}
	}
	for _, p := range ps {
		p.StopOffering()
	}
	time.Sleep(500 * time.Millisecond) // reports cover every assignment's end
}

// gauge reads a metric's value from reg (a counter or a gauge; labels summed).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v
}

// Three proxies on one user's month limit of 1,000, each offering 2,000 requests a
// second: together they admit between 950 and 1,000, never more, and what is counted
// is what they admitted (each reported every assignment's end) to within what the
// streams left unreported (quotaplane_rlqs_lost_units_total).
func TestRLQSThreeProxiesShareAMonthLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{grpcReg: reg})
	key := setupRLQS(r, "acme", 1000, 0)
	bucket := map[string]string{"team": "eng", "x-user-id": "alice"} // an alias, as descriptors have
	var ps []*loadgen.Proxy
	for range 3 {
		ps = append(ps, startProxy(t, r, key, 2000, bucket))
	}
	runUntilStill(ps, 2*time.Second, 20*time.Second)
	var admitted int64
	sent := 0
	for i, p := range ps {
		s := p.Stats()
		admitted += s.Admitted
		sent += s.TokenBuckets
		t.Logf("proxy %d admitted %d from %d token bucket assignments (%d actions)", i, s.Admitted, s.TokenBuckets, s.Actions)
	}
	all := gauge(t, reg, "quotaplane_rlqs_assignments_total")
	counted := r.used(key, "acme", "eng", "alice")
	lost := gauge(t, reg, "quotaplane_rlqs_lost_units_total")
	t.Logf("admitted %d, counted %d, assignments sent %d (%d token buckets), lost %.0f", admitted, counted, int(all), sent, lost)
	if admitted > 1000 || admitted < 950 {
		t.Errorf("admitted %d, want 950 to 1000", admitted)
	}
	if counted < admitted || float64(counted-admitted) > lost {
		t.Errorf("counted %d of %d admitted, want at least what was admitted and at most %.0f more", counted, admitted, lost)
	}
	if int64(all) > admitted/5 {
		t.Errorf("%d assignments sent for %d admitted, want at most admitted / 5", int(all), admitted)
	}
}

// A proxy cut mid-run without a last report: the proxies never admit past the limit,
// and what is counted past what they admitted is within the cut proxy's assignments
// the server could not settle (live at its last report or ending within the report
// lag of it).
func TestRLQSProxyCutWithoutAReport(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{grpcReg: reg})
	key := setupRLQS(r, "acme", 1000, 0)
	bucket := map[string]string{"team": "eng", "user": "bob"}
	a := startProxy(t, r, key, 2000, bucket)
	b := startProxy(t, r, key, 500, bucket)
	time.Sleep(400 * time.Millisecond)
	a.Cut()
	bound := a.Unreported(250 * time.Millisecond)
	runUntilStill([]*loadgen.Proxy{b}, 2*time.Second, 20*time.Second)
	cutAdmitted := a.Stats().Admitted
	admitted := cutAdmitted + b.Stats().Admitted
	counted := r.used(key, "acme", "eng", "bob")
	all := gauge(t, reg, "quotaplane_rlqs_assignments_total")
	t.Logf("admitted %d (cut proxy %d), counted %d, counted - admitted %d, the cut proxy's unsettled assignments %.0f, assignments sent %d, lost %.0f",
		admitted, cutAdmitted, counted, counted-admitted, bound, int(all), gauge(t, reg, "quotaplane_rlqs_lost_units_total"))
	if admitted > 1000 {
		t.Errorf("admitted %d, past the limit of 1000", admitted)
	}
	if counted > 1000 || counted < admitted || float64(counted-admitted) > bound {
		t.Errorf("counted %d of %d admitted, want at least what was admitted and at most %.0f more", counted, admitted, bound)
	}
	if int64(all) > admitted/5 {
		t.Errorf("%d assignments sent for %d admitted, want at most admitted / 5", int(all), admitted)
	}
}

// A team's minute limit and a user's month limit decided together through RLQS:
// within one minute the proxies admit no more than the team's minute limit, nor the
// user's month.
func TestRLQSTeamMinuteAndUserMonth(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := setupRLQS(r, "acme", 1000, 300)
	// the run stays in one minute (LeaseEnd ends assignments with it)
	if s := time.Now().Second(); s > 45 {
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	minute := time.Now().Truncate(time.Minute)
	bucket := map[string]string{"team": "eng", "user": "carol"}
	var ps []*loadgen.Proxy
	for range 3 {
		ps = append(ps, startProxy(t, r, key, 2000, bucket))
	}
	runUntilStill(ps, time.Second, 8*time.Second)
	var admitted int64
	for _, p := range ps {
		admitted += p.Stats().Admitted
	}
	if time.Now().Truncate(time.Minute) != minute {
		t.Skip("the run crossed a minute; the bound is of one minute")
	}
	t.Logf("admitted %d in one minute: team minute limit 300, user month limit 1000; counted %d", admitted, r.used(key, "acme", "eng", "carol"))
	if admitted > 300 || admitted < 280 {
		t.Errorf("admitted %d in one minute, want 280 to 300 (the team's minute limit)", admitted)
	}
}

// Buckets that cannot be decided are DENY_ALL, counting nothing, while the stream's
// other buckets are decided; a stream without a key or with a wrong one is
// Unauthenticated.
func TestRLQSBadBucketsAndKeys(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	key := setupRLQS(r, "acme", 1000, 0)
	good := map[string]string{"team": "eng", "user": "dave"}
	bad := []map[string]string{
		{"team": "eng", "user": "not an id!"},
		{"team": "nope", "user": "dave"},
		{"org": "other", "user": "dave"},
		{"colour": "red"},
		{"team": "eng", "user": "dave", "x-user-id": "erin"},
	}
	p := startProxy(t, r, key, 50, append([]map[string]string{good}, bad...)...)
	time.Sleep(600 * time.Millisecond)
	p.Cut()
	for _, id := range append([]map[string]string{good}, bad...) {
		as, admitted := p.Bucket(id)
		var kinds []string
		for _, a := range as {
			kinds = append(kinds, map[bool]string{true: "deny", false: "tokens"}[a.Deny])
		}
		isGood := fmt.Sprint(id) == fmt.Sprint(good)
		switch {
		case len(kinds) == 0:
			t.Errorf("bucket %v: no assignment", id)
		case isGood && (kinds[0] != "tokens" || admitted == 0):
			t.Errorf("bucket %v: %v, admitted %d; want token buckets", id, kinds, admitted)
		case !isGood && (slices.Contains(kinds, "tokens") || admitted != 0):
			t.Errorf("bucket %v: %v, admitted %d; want DENY_ALL only", id, kinds, admitted)
		}
	}

	for _, k := range []string{"", "qp_live_wrongwrongwrongwrong"} {
		s := startProxy(t, r, k, 10, good)
		time.Sleep(100 * time.Millisecond)
		if err := s.Stats().Err; status.Code(err) != codes.Unauthenticated {
			t.Errorf("key %q: %v, want Unauthenticated", k, err)
		}
	}
}

// A stream watches at most MaxBuckets buckets: one more is DENY_ALL, counting nothing,
// while the others are decided; a stream silent for IdleTimeout is closed, status OK.
func TestRLQSBoundedStreams(t *testing.T) {
	r := newReplicaWith(t, testenv.PostgresURL(t), testenv.ID(t, "r"), replicaOptions{
		rlqs: rls.RLQSLimits{MaxBuckets: 2, IdleTimeout: 300 * time.Millisecond}})
	key := setupRLQS(r, "acme", 1000, 0)
	ids := []map[string]string{{"team": "eng", "user": "u1"}, {"team": "eng", "user": "u2"}, {"team": "eng", "user": "u3"}}
	p := startProxy(t, r, key, 50, ids...)
	time.Sleep(500 * time.Millisecond)
	p.Cut()
	tokens := 0
	for _, id := range ids {
		as, _ := p.Bucket(id)
		if len(as) > 0 && !as[0].Deny {
			tokens++
		}
	}
	if tokens != 2 {
		t.Errorf("%d of 3 buckets had token buckets, want 2 (MaxBuckets)", tokens)
	}

	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+key)
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(r.conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("a silent stream ended with %v, want its end (OK)", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 5*time.Second {
		t.Errorf("a silent stream ended after %v, want the idle timeout, 300ms", d)
	}
}

// A key revoked while its stream is open ends the stream (Unauthenticated) at the
// next report: the key is checked again on every report.
func TestRLQSRevokedKeyEndsTheStream(t *testing.T) {
	r := newReplica(t, testenv.PostgresURL(t), testenv.ID(t, "r"))
	setupRLQS(r, "acme", 1000, 0)
	var k api.ApiKeyCreated
	if err := json.Unmarshal([]byte(r.mustDo("POST", "/v1/orgs/acme/api-keys", `{"name":"edge","scopes":["check"]}`, 201)), &k); err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, r, k.Secret, 50, map[string]string{"team": "eng", "user": "frank"})
	time.Sleep(300 * time.Millisecond)
	if err := p.Stats().Err; err != nil {
		t.Fatalf("the stream ended before the key was revoked: %v", err)
	}
	r.mustDo("DELETE", "/v1/orgs/acme/api-keys/"+string(k.Id), "", 204)
	deadline := time.Now().Add(3 * time.Second)
	for p.Stats().Err == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.Stats().Err; status.Code(err) != codes.Unauthenticated {
		t.Errorf("after the key's revocation the stream ended with %v, want Unauthenticated within a second and a report", err)
	}
}
