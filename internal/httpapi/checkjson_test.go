package httpapi

// An internal test: the hand-written JSON of the check route is unexported, and what
// matters is that it is byte for byte what encoding/json does.

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func TestCheckJSONEncode(t *testing.T) {
	yes, secs, warn := true, int64(42), `over quota at user "u<1>" (minute) & more`
	reset := time.Date(2026, 11, 21, 14, 31, 0, 0, time.UTC)
	levels := []api.LevelStatus{
		{Id: "acme", Level: vocab.LevelOrg, Limit: 1 << 53, Remaining: 0, ResetAt: reset, Used: 1 << 53, Window: vocab.Month},
		{Id: "eng.team:x@y-z", Level: vocab.LevelTeam, Limit: 10, Remaining: 3, ResetAt: reset.Add(1500 * time.Millisecond), Used: 7, Window: vocab.Minute},
		{Id: "u1", Level: vocab.LevelUser, Limit: 0, Remaining: -1, ResetAt: reset.Add(123456789), Used: -5, Window: vocab.Second},
	}
	ref := &api.LevelRef{Id: "u1", Level: vocab.LevelUser, Window: vocab.Second}
	violated, odd := []string{"user-second"}, []string{"tokens-user-minute", "a<b>&\"c"}
	tokens := "tokens"
	capRef := &api.LevelRef{Id: "gpt-4o", Level: vocab.LevelCapacity, Metric: &tokens, Window: vocab.Minute}
	shareRef := &api.LevelRef{Id: "acme", Level: vocab.LevelOrg, Window: vocab.Minute, FairShare: &yes}
	cases := map[string]api.CheckResult{
		"empty":                 {},
		"no rows":               {Allowed: true, Mode: vocab.Enforce, Levels: []api.LevelStatus{}},
		"allowed":               {Allowed: true, Mode: vocab.Enforce, Levels: levels},
		"denied":                {Mode: vocab.Enforce, Levels: levels, BlockedAt: ref, RetryAfterSeconds: &secs, ViolatedPolicies: &violated},
		"violated, odd":         {Mode: vocab.Enforce, Levels: levels, BlockedAt: ref, RetryAfterSeconds: &secs, ViolatedPolicies: &odd},
		"warn":                  {Allowed: true, Mode: vocab.Warn, Levels: levels, WouldBlock: ref, Warning: &warn},
		"degraded and replayed": {Allowed: true, Mode: vocab.Shadow, Levels: levels[:1], Degraded: &yes, Replayed: &yes},
		"throttled":             {Allowed: true, Mode: vocab.Enforce, Levels: levels, Throttled: &api.Throttled{Factor: 0.5, ExpiresAt: reset, Scope: api.ThrottleScopeOrg}},
		"throttled finely":      {Mode: vocab.Enforce, Levels: levels[:1], BlockedAt: ref, RetryAfterSeconds: &secs, Throttled: &api.Throttled{Factor: 0.000001, ExpiresAt: reset.Add(1500 * time.Millisecond), Scope: api.ThrottleScopePlan}},
		"bucket":                {Mode: vocab.Enforce, Levels: bucketLevels(levels), BlockedAt: ref},
		"capacity":              {Mode: vocab.Enforce, Levels: []api.LevelStatus{}, BlockedAt: capRef, RetryAfterSeconds: &secs},
		"fair share":            {Mode: vocab.Enforce, Levels: levels[:1], BlockedAt: shareRef, RetryAfterSeconds: &secs},
		"capacity would block":  {Allowed: true, Mode: vocab.Shadow, Levels: levels, WouldBlock: capRef},
		"odd strings":           {Mode: "mode\"\\\n\u2028é", Levels: []api.LevelStatus{{Id: "<script>", ResetAt: reset.In(time.FixedZone("x", 3600))}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			var want bytes.Buffer
			enc := json.NewEncoder(&want)
			enc.SetEscapeHTML(false) // as writeJSON writes
			if err := enc.Encode(c); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want.String(), string(appendCheckResult(nil, &c))); diff != "" {
				t.Errorf("appendCheckResult differs from encoding/json (-want +got):\n%s", diff)
			}
		})
	}
}

// bucketLevels is levels with the second one a token bucket of burst 30.
func bucketLevels(levels []api.LevelStatus) []api.LevelStatus {
	out := append([]api.LevelStatus{}, levels...)
	b := int64(30)
	out[1].Burst = &b
	return out
}

// appendTime's hand-written path (UTC whole seconds) and its fallback both write what
// encoding/json writes, over many instants, zones, fractions and the year bounds.
func TestAppendTimeLikeEncodingJSON(t *testing.T) {
	times := []time.Time{
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(1999, 9, 9, 9, 9, 9, 0, time.UTC), time.Unix(0, 0), time.Unix(0, 0).UTC(),
	}
	for i := int64(0); i < 20000; i++ {
		sec := 1_700_000_000 + i*7919*3607 // about 18 years, every field value
		times = append(times, time.Unix(sec, 0).UTC(), time.Unix(sec, i%3*250_000_000).UTC(),
			time.Unix(sec, 0).In(time.FixedZone("x", 3600)))
	}
	for _, tm := range times {
		want, err := json.Marshal(tm)
		if err != nil {
			continue // outside encoding/json's years: not an answer's
		}
		if got := appendTime(nil, tm); string(got) != string(want) {
			t.Fatalf("appendTime(%v) = %s, encoding/json %s", tm, got, want)
		}
	}
}

func TestCheckJSONDecode(t *testing.T) {
	bodies := []string{
		`{"org":"acme"}`,
		` { "org" : "acme" , "team":"eng",` + "\n\t" + `"user":"u1","metric":"tokens","cost":12,"idempotency_key":"abcdefgh-1"} `,
		`{"org":"acme","cost":0}`,
		`{"org":"acme","cost":-3}`,
		`{}`,
		`{"org":"acme","cost":9223372036854775807}`,
		// handed to decodeStrict, which accepts or refuses them
		`{"org":"acme","cost":9223372036854775808}`,
		`{"org":"acme","cost":1.0}`,
		`{"org":"acme","cost":1e3}`,
		`{"org":"acme","cost":01}`,
		`{"org":"acme","cost":"1"}`,
		`{"org":"acme","team":null}`,
		`{"ORG":"acme"}`,
		`{"org":"a\u0063me"}`,
		`{"org":"acmé"}`,
		`{"org":"acme","org":"other"}`,
		`{"org":"acme","extra":1}`,
		`{"org":"acme"} {"org":"acme"}`,
		`{"org":"acme"}]`,
		`{"org":"acme",}`,
		`{"org":"acme"`,
		`["org"]`,
		``,
		`{"org":"acme","cost":}`,
		`{"org":"acme","cost":-}`,
	}
	for i, body := range bodies {
		t.Run(body, func(t *testing.T) {
			var in api.CheckRequest
			if fast := parseCheckRequest([]byte(body), &in); fast != (i < 6) {
				t.Errorf("parseCheckRequest = %v, want %v", fast, i < 6)
			}
			want := httptest.NewRecorder()
			var wantIn api.CheckRequest
			wantOK := decodeShaped(want, httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(body)), &wantIn, checkShape)
			got := httptest.NewRecorder()
			var gotIn api.CheckRequest
			gotOK := decodeCheck(got, httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(body)), &gotIn)
			if wantOK != gotOK || want.Code != got.Code || want.Body.String() != got.Body.String() {
				t.Fatalf("decodeCheck = %v %d %q, decodeShaped = %v %d %q", gotOK, got.Code, got.Body, wantOK, want.Code, want.Body)
			}
			if diff := cmp.Diff(wantIn, gotIn); wantOK && diff != "" {
				t.Errorf("decoded request differs (-decodeShaped +decodeCheck):\n%s", diff)
			}
		})
	}
}

func TestBatchJSON(t *testing.T) {
	bodies := []string{
		`{"checks":[{"org":"acme"},{"org":"acme","team":"eng","user":"u1","cost":2}]}`,
		` {"checks" : [ ] } `,
		`{"checks":[{}]}`,
		// handed to encoding/json
		`{"checks":[{"org":"acme"},]}`,
		`{"checks":[{"org":"acme"}],"x":1}`,
		`{"checks":null}`,
		`{"Checks":[{"org":"acme"}]}`,
		`{"checks":[{"org":"acme","cost":1.5}]}`,
		`{"checks":[{"org":"acme"}]`,
		`{}`,
	}
	for i, body := range bodies {
		t.Run(body, func(t *testing.T) {
			var in api.BatchCheckRequest
			if fast := parseBatchRequest([]byte(body), &in); fast != (i < 3) {
				t.Errorf("parseBatchRequest = %v, want %v", fast, i < 3)
			}
			want := httptest.NewRecorder()
			var wantIn api.BatchCheckRequest
			wantOK := decodeShaped(want, httptest.NewRequest(http.MethodPost, "/v1/check/batch", strings.NewReader(body)), &wantIn, batchShape)
			got := httptest.NewRecorder()
			var gotIn api.BatchCheckRequest
			gotOK := decodeBatch(got, httptest.NewRequest(http.MethodPost, "/v1/check/batch", strings.NewReader(body)), &gotIn)
			if wantOK != gotOK || want.Code != got.Code || want.Body.String() != got.Body.String() {
				t.Fatalf("decodeBatch = %v %d %q, decodeShaped = %v %d %q", gotOK, got.Code, got.Body, wantOK, want.Code, want.Body)
			}
			if diff := cmp.Diff(wantIn, gotIn); wantOK && diff != "" {
				t.Errorf("decoded request differs (-decodeShaped +decodeBatch):\n%s", diff)
			}
		})
	}

	reset := time.Date(2026, 11, 21, 14, 31, 0, 0, time.UTC)
	res := api.CheckResult{Allowed: true, Mode: vocab.Enforce, Levels: []api.LevelStatus{
		{Id: "acme", Level: vocab.LevelOrg, Limit: 5, Remaining: 4, ResetAt: reset, Used: 1, Window: vocab.Month}}}
	items := make([]api.BatchCheckItem, 3)
	b := appendCheckResult(nil, &res)
	_ = items[0].UnmarshalJSON(b[:len(b)-1])
	_ = items[1].FromProblem(itemProblem(derrors.Field("org", "must match <pattern> & more")))
	_ = items[2].FromCheckResult(res)
	want := httptest.NewRecorder()
	writeJSON(want, http.StatusOK, api.BatchCheckResult{Results: items})
	got := httptest.NewRecorder()
	writeBatchResult(got, items)
	if diff := cmp.Diff(want.Body.String(), got.Body.String()); diff != "" {
		t.Errorf("writeBatchResult differs from encoding/json (-want +got):\n%s", diff)
	}
}

func BenchmarkEncodeCheckResult(b *testing.B) {
	reset := time.Date(2026, 11, 21, 14, 31, 0, 0, time.UTC)
	var levels []api.LevelStatus
	for _, l := range []api.Level{vocab.LevelOrg, vocab.LevelTeam, vocab.LevelUser} {
		for _, w := range []api.Window{vocab.Minute, vocab.Month} {
			levels = append(levels, api.LevelStatus{Id: "user-123", Level: l, Limit: 1 << 40, Remaining: 1<<40 - 12345, ResetAt: reset, Used: 12345, Window: w})
		}
	}
	res := api.CheckResult{Allowed: true, Mode: vocab.Enforce, Levels: levels}
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 2048)
		for b.Loop() {
			buf = appendCheckResult(buf[:0], &res)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		var buf bytes.Buffer
		for b.Loop() {
			buf.Reset()
			_ = json.NewEncoder(&buf).Encode(res)
		}
	})
}

func BenchmarkDecodeCheckRequest(b *testing.B) {
	body := []byte(`{"org":"acme","team":"eng","user":"u123","cost":1}`)
	b.Run("hand", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var in api.CheckRequest
			_ = parseCheckRequest(body, &in)
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var in api.CheckRequest
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			_ = dec.Decode(&in)
		}
	})
	b.Run("strict", func(b *testing.B) { // the fallback: exact names, then encoding/json
		b.ReportAllocs()
		for b.Loop() {
			var in api.CheckRequest
			_ = decodeStrict(body, &in, checkShape)
		}
	})
}
