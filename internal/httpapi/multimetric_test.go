package httpapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// multiSetup makes a plan of requests and tokens, org acme, team eng (tokens 500 a
// month) and user alice (tokens 300 a month); it returns a check key and an admin key.
func multiSetup(r *resReplica) (string, string) {
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"pm","name":"P","fail_mode":"closed","limits":[
		{"metric":"requests","window":"month","limit":100},{"metric":"tokens","window":"month","limit":1000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"pm"}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams", operatorToken, `{"id":"eng","name":"Eng","limits":[{"metric":"tokens","window":"month","limit":500}]}`, 201)
	r.mustDo("POST", "/v1/orgs/acme/teams/eng/users", operatorToken, `{"id":"alice","limits":[{"metric":"tokens","window":"month","limit":300}]}`, 201)
	return keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
}

// usageOf is org acme's usage as the API shows it, to compare before and after.
func usageOf(t *testing.T, r *resReplica, admin string) string {
	t.Helper()
	b, _ := json.Marshal(r.usage(t, "acme", admin).Metrics)
	return string(b)
}

func TestMultiMetricCheckOverHTTP(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	key, admin := multiSetup(r)

	got := r.check(key, `{"org":"acme","user":"alice","costs":{"requests":1,"tokens":250}}`)
	if got.code != 200 || !got.body.Allowed || len(got.body.Levels) != 4 {
		t.Fatalf("check = %d %s", got.code, got.raw)
	}
	for _, l := range got.body.Levels {
		if l.Metric == nil || (*l.Metric != "requests" && *l.Metric != "tokens") {
			t.Fatalf("a level without its metric: %s", got.raw)
		}
	}
	// costs of one metric: a one-metric decision, its levels naming the metric
	if one := r.check(key, `{"org":"acme","user":"alice","costs":{"requests":1}}`); one.code != 200 || !strings.Contains(one.raw, `"metric":"requests"`) {
		t.Fatalf("costs of one metric = %d %s", one.code, one.raw)
	}
	// the tightest across metrics: alice's tokens, 50 left
	if h := strings.Join(got.header["RateLimit-Remaining"], ","); h != "50" {
		t.Errorf("RateLimit-Remaining %q, want 50 (alice's tokens): %s", h, got.raw)
	}

	before := usageOf(t, r, admin)
	got = r.check(key, `{"org":"acme","user":"alice","costs":{"requests":1,"tokens":51}}`)
	if got.code != 429 || got.body.BlockedAt == nil || got.body.BlockedAt.Metric == nil || *got.body.BlockedAt.Metric != "tokens" ||
		got.body.BlockedAt.Level != "user" {
		t.Fatalf("tokens over alice's limit = %d %s, want 429 blocked at tokens user", got.code, got.raw)
	}
	if after := usageOf(t, r, admin); after != before {
		t.Fatalf("a denied multi-metric check counted:\nbefore %s\nafter  %s", before, after)
	}

	many := make([]string, 17)
	for i := range many {
		many[i] = fmt.Sprintf(`"m%d":1`, i)
	}
	bad := []struct {
		name, body string
		code       int
		field      string
	}{
		{"metric and costs", `{"org":"acme","metric":"tokens","costs":{"tokens":1}}`, 400, `"metric"`},
		{"cost and costs", `{"org":"acme","cost":1,"costs":{"tokens":1}}`, 400, `"cost"`},
		{"17 metrics", `{"org":"acme","costs":{` + strings.Join(many, ",") + `}}`, 400, `costs`},
		{"no metric", `{"org":"acme","costs":{}}`, 400, `costs`},
		{"cost below 0", `{"org":"acme","costs":{"requests":1,"tokens":-1}}`, 400, `costs`},
		{"cost too large", `{"org":"acme","costs":{"requests":1,"tokens":1125899906842625}}`, 400, `costs`},
		{"unknown metric", `{"org":"acme","costs":{"requests":1,"gpu":1}}`, 422, `gpu`},
	}
	for _, tc := range bad {
		rec := r.f.do("POST", "/v1/check", key, tc.body)
		if rec.Code != tc.code || !strings.Contains(rec.Body.String(), tc.field) ||
			!strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json") {
			t.Errorf("%s: %d %s, want %d problem+json naming %s", tc.name, rec.Code, rec.Body, tc.code, tc.field)
		}
	}
	if after := usageOf(t, r, admin); after != before {
		t.Fatalf("refused checks counted:\nbefore %s\nafter  %s", before, after)
	}

	// a batch item of several metrics, beside one of one metric
	rec := r.f.do("POST", "/v1/check/batch", key, `{"checks":[{"org":"acme","user":"alice","costs":{"requests":1,"tokens":10}},
		{"org":"acme","user":"alice","metric":"requests"},{"org":"acme","user":"alice","costs":{"requests":1,"tokens":1000}}]}`)
	var batch struct {
		Results []json.RawMessage `json:"results"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &batch)
	if rec.Code != 200 || len(batch.Results) != 3 || !strings.Contains(string(batch.Results[0]), `"allowed":true`) ||
		!strings.Contains(string(batch.Results[0]), `"metric":"tokens"`) || strings.Contains(string(batch.Results[1]), `"metric"`) ||
		!strings.Contains(string(batch.Results[2]), `"level":"org","metric":"tokens","window":"month"},`) {
		t.Fatalf("batch = %d %s", rec.Code, rec.Body)
	}

	// idempotency covers the costs
	code, _ := r.checkWith("/v1/check", key, `{"org":"acme","user":"alice","costs":{"requests":1,"tokens":5}}`, map[string]string{"Idempotency-Key": "multi-key-1"})
	code2, body2 := r.checkWith("/v1/check", key, `{"org":"acme","user":"alice","costs":{"requests":1,"tokens":5}}`, map[string]string{"Idempotency-Key": "multi-key-1"})
	if code != 200 || code2 != 200 || !strings.Contains(body2, `"replayed":true`) || !strings.Contains(body2, `"metric":"tokens"`) {
		t.Fatalf("replay = %d %d %s", code, code2, body2)
	}
	before = usageOf(t, r, admin)
	if code, body := r.checkWith("/v1/check", key, `{"org":"acme","user":"alice","costs":{"requests":1,"tokens":6}}`, map[string]string{"Idempotency-Key": "multi-key-1"}); code != 422 {
		t.Fatalf("the key with other costs = %d %s, want 422", code, body)
	}
	if after := usageOf(t, r, admin); after != before {
		t.Fatalf("an idempotency conflict counted")
	}
}

func TestMultiMetricReservationsOverHTTP(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	key, admin := multiSetup(r)

	before := usageOf(t, r, admin)
	for _, tc := range []struct{ name, body string }{
		{"amount and amounts", `{"org":"acme","user":"alice","amount":5,"amounts":{"tokens":5}}`},
		{"metric and amounts", `{"org":"acme","user":"alice","metric":"tokens","amounts":{"tokens":5}}`},
		{"all 0", `{"org":"acme","user":"alice","amounts":{"tokens":0}}`},
	} {
		if rec := r.f.do("POST", "/v1/reservations", key, tc.body); rec.Code != 400 || !strings.Contains(rec.Body.String(), `amounts`) {
			t.Errorf("%s: %d %s, want 400 naming amounts", tc.name, rec.Code, rec.Body)
		}
	}
	if after := usageOf(t, r, admin); after != before {
		t.Fatalf("refused reservations held units")
	}

	code, res, raw := r.reserve(key, `{"org":"acme","user":"alice","amounts":{"tokens":200,"requests":1}}`)
	if code != 201 || res.Metrics == nil || len(*res.Metrics) != 2 || (*res.Metrics)[1].Metric != "tokens" || (*res.Metrics)[1].Amount != 200 {
		t.Fatalf("reserve = %d %s", code, raw)
	}
	// the held tokens count: 101 more do not fit alice's 300
	if code, _, raw := r.reserve(key, `{"org":"acme","user":"alice","amounts":{"tokens":101,"requests":1}}`); code != 429 || !strings.Contains(raw, `"metric":"tokens"`) {
		t.Fatalf("reserve over held = %d %s", code, raw)
	}
	path := "/v1/reservations/" + res.Id
	if rec := r.f.do("POST", path+"/commit", key, `{"used":5}`); rec.Code != 400 {
		t.Errorf("a number for two metrics = %d %s, want 400", rec.Code, rec.Body)
	}
	if rec := r.f.do("POST", path+"/commit", key, `{"used":{"gpu":5}}`); rec.Code != 400 {
		t.Errorf("used of a metric not held = %d %s, want 400", rec.Code, rec.Body)
	}
	var got api.Reservation
	_ = json.Unmarshal([]byte(r.mustDo("POST", path+"/commit", key, `{"used":{"tokens":120}}`, 200)), &got)
	if got.State != "committed" || got.Metrics == nil || len(*got.Metrics) != 2 {
		t.Fatalf("commit = %+v", got)
	}
	req, tok := (*got.Metrics)[0], (*got.Metrics)[1]
	if *req.Used != 0 || *req.Released != 1 || *tok.Used != 120 || *tok.Released != 80 || *tok.OverReserved != 0 {
		t.Fatalf("commit metrics %+v %+v", req, tok)
	}
	u := r.usage(t, "acme", admin)
	for _, m := range u.Metrics {
		want := map[string]int64{"requests": 0, "tokens": 120}[m.Metric]
		if m.Org.Used != want || reservedOf(m.Org) != 0 {
			t.Errorf("%s: used %d reserved %d, want %d and 0", m.Metric, m.Org.Used, reservedOf(m.Org), want)
		}
	}
	// a one-metric reservation still commits a number, or an object naming its metric
	_, one, _ := r.reserve(key, `{"org":"acme","user":"alice","metric":"tokens","amount":10}`)
	if body := r.mustDo("POST", "/v1/reservations/"+one.Id+"/commit", key, `{"used":{"tokens":7}}`, 200); !strings.Contains(body, `"used":7`) {
		t.Errorf("one-metric commit of an object = %s", body)
	}
}
