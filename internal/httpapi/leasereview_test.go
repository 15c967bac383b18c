package httpapi_test

import (
	"encoding/json"
	"testing"
	"time"
)

// leaseOrg is a replica with org acme on a plan of 100,000 requests a month.
func leaseOrg(t *testing.T) *resReplica {
	r := newResReplicas(t, 1)[0]
	r.mustDo("POST", "/v1/plans", operatorToken, `{"id":"p","name":"P","fail_mode":"closed","limits":[{"metric":"requests","window":"month","limit":100000}]}`, 201)
	r.mustDo("POST", "/v1/orgs", operatorToken, `{"id":"acme","name":"A","plan":"p"}`, 201)
	return r
}

// A path answered near_limit is leased again once its headroom is back: here a
// reservation that held most of the limit is released. The headroom a refusal showed
// sizes the next lease, and never keeps the path at near_limit without asking Redis.
func TestClientLeaseAfterHeadroomComesBack(t *testing.T) {
	r := leaseOrg(t)
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

// A lease that expired unsettled is counted whole, and settling it with renew, once or
// again (a repeat whose answer was lost), holds no second lease: a repeat answers the
// first settlement with next null, and the server cannot tell the first settlement of
// an expired lease from a repeat.
func TestClientLeaseExpiredSettlementTakesNoSecondLease(t *testing.T) {
	r := leaseOrg(t)
	r.sweep(t, 100*time.Millisecond)
	key, admin := keyOf(r.replica, "acme", `["check"]`), keyOf(r.replica, "acme", `["admin"]`)
	l := leaseOf(t, r.mustDo("POST", "/v1/leases", key, `{"org":"acme","rate":100}`, 201))
	time.Sleep(time.Until(*l.SettleBy) + 500*time.Millisecond)
	held := int64(0)
	for i := range 2 {
		s := settlementOf(t, r.mustDo("POST", "/v1/leases/"+*l.Id+"/settle", key, `{"used":1,"renew":true,"rate":100}`, 200))
		if s.Settled.Used != l.Units || s.Settled.Released != 0 {
			t.Errorf("settlement %d of an expired lease = %+v, want counted whole (%d)", i+1, s.Settled, l.Units)
		}
		if s.Next != nil {
			held += s.Next.Units
			if i > 0 {
				t.Errorf("a repeated settlement of an expired lease took another lease: %+v", *s.Next)
			}
		}
	}
	for _, m := range r.usage(t, "acme", admin).Metrics {
		if m.Metric == "requests" && (m.Org.Used != l.Units || m.Org.Reserved != held) {
			t.Errorf("usage: used %d reserved %d, want %d and %d", m.Org.Used, m.Org.Reserved, l.Units, held)
		}
	}
}
