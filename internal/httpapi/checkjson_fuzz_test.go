package httpapi

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// Whatever the hand-written parsers accept, the contract (referenceDecode: encoding/json
// with field names exactly as declared) must accept too, and encoding/json decode to the
// same request: the fast path may only ever decline, never differ.
func FuzzCheckRequestParsersAgreeWithTheContract(f *testing.F) {
	for _, s := range []string{
		`{"org":"acme","team":"eng","user":"alice","metric":"requests","cost":3,"idempotency_key":"order-12345"}`,
		`{"org":"acme"}`, ` { "org" : "a" , "cost" : 0 } `, `{"org":"a","cost":-1}`, `{"org":"a","cost":1e3}`,
		`{"org":"a","org":"b"}`, `{"org":"a\u0041"}`, `{"org":"a"} x`, `{"checks":[{"org":"a"},{"org":"b","cost":2}]}`,
		`{"checks":[]}`, `{"org":null}`, `{"cost":9007199254740993,"org":"a"}`, `{"org":"a","cost":01}`,
		`{"ORG":"a"}`, `{"cost":1,"Cost":500,"org":"a"}`, `{"checks":[{"org":"a","COST":1}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var fast api.CheckRequest
		if parseCheckRequest(b, &fast) {
			var slow api.CheckRequest
			if err := referenceDecode(b, &slow); err != nil {
				t.Fatalf("fast path accepted %q, the contract refuses it: %v", b, err)
			}
			if diff := cmp.Diff(slow, fast); diff != "" {
				t.Fatalf("%q decodes differently (-encoding/json +fast):\n%s", b, diff)
			}
		}
		var fastBatch api.BatchCheckRequest
		if parseBatchRequest(b, &fastBatch) {
			var slow api.BatchCheckRequest
			if err := referenceDecode(b, &slow); err != nil {
				t.Fatalf("fast batch path accepted %q, the contract refuses it: %v", b, err)
			}
			if diff := cmp.Diff(slow, fastBatch); diff != "" {
				t.Fatalf("%q decodes differently (-encoding/json +fast):\n%s", b, diff)
			}
		}
	})
}
