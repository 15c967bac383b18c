package httpapi_test

import (
	"encoding/json"
	"testing"
)

// A path answered near_limit is leased again once its headroom is back: here a
// reservation that held most of the limit is released. The headroom a refusal showed
// sizes the next lease, and never keeps the path at near_limit without asking Redis.
func TestClientLeaseAfterHeadroomComesBack(t *testing.T) {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":100000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	key := keyOf(r.replica, "acme", `["check"]`)
	var rv struct{ ID string }
	if err := json.Unmarshal([]byte(r.mustDo("POST", "/v1/reservations", key, `{"org":"acme","amount":99990}`, 201)), &rv); err != nil || rv.ID == "" {
		t.Fatalf("reservation: %v %+v", err, rv)
	}
	l := leaseOf(t, r.mustDo("POST", "/v1/leases", key, `{"org":"acme","rate":1000}`, 200))
	if l.Reason == nil || *l.Reason != "near_limit" {
		t.Fatalf("lease with 10 units left = %+v, want near_limit", l)
	}
	r.mustDo("DELETE", "/v1/reservations/"+rv.ID, key, ``, 200)
	l = leaseOf(t, r.mustDo("POST", "/v1/leases", key, `{"org":"acme","rate":1000}`, 201))
	if l.Units < 4 {
		t.Errorf("lease with the whole limit left = %+v, want units", l)
	}
}
