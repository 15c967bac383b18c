package httpapi_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// With Redis down a replica stays ready (status degraded, naming Redis), and the
// checks that pass its readiness gate are answered by each plan's fail mode: open
// allows, local decides on the replica, closed answers 503 with Retry-After. A /readyz
// of 503 on every replica at once would have Kubernetes empty the Service.
func TestReadyWithRedisDownWhileFailModesAnswer(t *testing.T) {
	const dead = "redis://127.0.0.1:1/0" // nothing listens there
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := testenv.ID(t, "rz")
	r := newReplicaOn(t, testenv.PostgresURL(t), prefix, time.Hour, prometheus.NewRegistry(), quota.Config{KeyPrefix: prefix}, dead, rdb)

	rec := r.f.do("GET", "/readyz", "", "")
	var h struct {
		Status string
		Checks map[string]string
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &h)
	if rec.Code != 200 || h.Status != "degraded" || h.Checks["redis"] != "unreachable" || h.Checks["postgres"] != "ok" {
		t.Fatalf("/readyz with Redis down = %d %s; want 200, degraded, redis unreachable", rec.Code, rec.Body)
	}

	for _, c := range []struct {
		mode string
		code int
	}{{"open", 200}, {"local", 200}, {"closed", 503}} {
		org := "o-" + c.mode
		key, _ := r.setup(org)
		r.mustDo("PATCH", "/v1/plans/p-"+org, operatorToken, `{"fail_mode":"`+c.mode+`"}`, 200)
		got := r.check(key, `{"org":"`+org+`","team":"eng"}`)
		switch {
		case got.code != c.code:
			t.Errorf("%s plan, Redis down: %d %s, want %d", c.mode, got.code, got.raw, c.code)
		case c.code == 200 && (got.body.Degraded == nil || !*got.body.Degraded):
			t.Errorf("%s plan, Redis down: %s, want degraded", c.mode, got.raw)
		case c.code == 503 && got.header.Get("Retry-After") == "":
			t.Errorf("closed plan, Redis down: 503 without Retry-After")
		}
	}
}
