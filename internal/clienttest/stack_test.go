package clienttest

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// redisDB is the Redis database of the stacks of this package's tests.
const redisDB = 12

// TestMain removes the binaries testenv.StartStack builds.
func TestMain(m *testing.M) { testenv.Main(m) }

// env is a running api and worker with an org of the test's own: plan limits of
// requests (org: 50 a minute) and tokens (1000 a month), team eng whose users have
// 3 requests a minute, and an org key with the check scope.
type env struct {
	t   *testing.T
	st  *testenv.Stack
	org string
	key string // the org's key, scope check
}

func (e *env) url() string { return "http://" + e.st.APIAddr }

// newEnv starts the stack (one per test: each holds Redis database redisDB while it
// runs) and seeds the test's org through the API. orgExtra is more JSON members of
// the org (after a comma); the plan's fail_mode is open.
func newEnv(t *testing.T, orgExtra string) *env {
	t.Helper()
	return newEnvPlan(t, `{"metric":"requests","window":"minute","limit":50},{"metric":"tokens","window":"month","limit":1000}`, orgExtra)
}

// newEnvPlan is newEnv with the plan's limits given (JSON members of its limits).
func newEnvPlan(t *testing.T, planLimits, orgExtra string) *env {
	t.Helper()
	if testing.Short() {
		t.Skip("starts the api and the worker")
	}
	st := testenv.StartStack(t, testenv.StackOptions{RedisDB: redisDB, Env: []string{"QUOTA_WEBHOOK_ALLOW_PRIVATE=true"}})
	e := &env{t: t, st: st, org: testenv.ID(t, "cl")}
	e.op("POST", "/v1/plans", `{"id":"p-`+e.org+`","name":"P","fail_mode":"open","limits":[`+planLimits+`]}`, 201)
	e.op("POST", "/v1/orgs", `{"id":"`+e.org+`","name":"O","plan":"p-`+e.org+`"`+orgExtra+`}`, 201)
	e.op("POST", "/v1/orgs/"+e.org+"/teams", `{"id":"eng","name":"Eng","user_limits":[{"metric":"requests","window":"minute","limit":3}]}`, 201)
	var k struct {
		Secret string `json:"secret"`
	}
	e.decode(e.op("POST", "/v1/orgs/"+e.org+"/api-keys", `{"name":"svc","scopes":["check"]}`, 201), &k)
	e.key = k.Secret
	return e
}

// op calls the API with the operator token and fails the test unless it answers want.
func (e *env) op(method, path, body string, want int) []byte {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url()+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e.st.OperatorToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		e.t.Fatalf("%s %s = %d, want %d: %s", method, path, res.StatusCode, want, b)
	}
	return b
}

func (e *env) decode(b []byte, out any) {
	e.t.Helper()
	if err := json.Unmarshal(b, out); err != nil {
		e.t.Fatalf("decode %s: %v", b, err)
	}
}

// client is a client of the stack with the org's key.
func (e *env) client(opts ...client.Option) *client.Client {
	e.t.Helper()
	c, err := client.New(e.url(), e.key, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// used is what the level and window of a check of metric by alice of eng has used
// (usedBy).
func (e *env) used(metric, level, window string) int64 {
	e.t.Helper()
	return e.usedBy("alice", metric, level, window)
}
