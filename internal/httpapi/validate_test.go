package httpapi

// This test is in package httpapi because newRequestValidator is unexported.

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

const idPatternMsg = vocab.IDRule

// validPlan is a PlanCreate body that passes validation.
const validPlan = `{"id":"pro","name":"Pro","limits":[{"metric":"requests","window":"minute","limit":600}],"fail_mode":"open"}`

type problemBody struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail"`
	Errors []FieldError `json:"errors"`
}

// mustValidated wraps a handler that records the body it read and answers 299.
func mustValidated(tb testing.TB) (http.Handler, func() (bool, string)) {
	tb.Helper()
	mw, err := newRequestValidator()
	if err != nil {
		tb.Fatalf("newRequestValidator: %v", err)
	}
	var (
		mu     sync.Mutex
		called bool
		body   string
	)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			tb.Errorf("handler: read body: %v", err)
		}
		mu.Lock()
		called, body = true, string(b)
		mu.Unlock()
		w.WriteHeader(299)
	}))
	return h, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return called, body
	}
}

func TestRequestValidator(t *testing.T) {
	tests := []struct {
		name        string
		method      string
		path        string
		contentType string // "-" for none
		body        string
		wantStatus  int    // 299: reached the handler
		wantDetail  string // checked when set
		wantErrors  []FieldError
	}{
		{
			name: "valid body passes", method: "POST", path: "/v1/plans", body: validPlan,
			wantStatus: 299,
		},
		{
			name: "valid body with charset passes", method: "POST", path: "/v1/plans",
			contentType: "application/json; charset=utf-8", body: validPlan,
			wantStatus: 299,
		},
		{
			name: "missing content type is taken as JSON", method: "POST", path: "/v1/plans",
			contentType: "-", body: validPlan,
			wantStatus: 299,
		},
		{
			name: "unknown field", method: "POST", path: "/v1/plans",
			body:       `{"id":"pro","name":"Pro","limits":[],"fail_mode":"open","foo":1}`,
			wantStatus: 400,
			wantDetail: `foo: unknown field "foo"`,
			wantErrors: []FieldError{{Field: "foo", Message: `unknown field "foo"`}},
		},
		{
			name: "unknown nested field", method: "POST", path: "/v1/plans",
			body:       `{"id":"pro","name":"Pro","limits":[{"metric":"requests","window":"day","limit":1,"ceiling":2}],"fail_mode":"open"}`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "limits[0].ceiling", Message: `unknown field "ceiling"`}},
		},
		{
			name: "bad window enum", method: "POST", path: "/v1/plans",
			body:       `{"id":"pro","name":"Pro","limits":[{"metric":"requests","window":"minute","limit":1},{"metric":"requests","window":"week","limit":1}],"fail_mode":"open"}`,
			wantStatus: 400,
			wantDetail: "limits[1].window: must be one of second, minute, hour, day, month, concurrent",
			wantErrors: []FieldError{{Field: "limits[1].window", Message: "must be one of second, minute, hour, day, month, concurrent"}},
		},
		{
			name: "bad id pattern in body", method: "POST", path: "/v1/plans",
			body:       `{"id":"-pro","name":"Pro","limits":[],"fail_mode":"open"}`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "id", Message: idPatternMsg}},
		},
		{
			name: "bad id pattern in path", method: "GET", path: "/v1/orgs/acme/teams/-eng",
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "team", Message: idPatternMsg}},
		},
		{
			name: "escaped space in path id", method: "GET", path: "/v1/orgs/ac%20me",
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "org", Message: idPatternMsg}},
		},
		{
			name: "good path ids pass", method: "GET", path: "/v1/orgs/acme.io/teams/eng:1/users/alice@example.com",
			wantStatus: 299,
		},
		{
			name: "missing required", method: "POST", path: "/v1/orgs",
			body:       `{"id":"acme","name":"Acme"}`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "plan", Message: "is required"}},
		},
		{
			name: "missing required nested", method: "POST", path: "/v1/orgs/acme/teams",
			body:       `{"id":"eng","name":"Eng","user_limits":[{"metric":"requests","limit":5}]}`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "user_limits[0].window", Message: "is required"}},
		},
		{
			name: "wrong types", method: "POST", path: "/v1/plans",
			body:       `{"id":"pro","name":7,"limits":[{"metric":"requests","window":"day","limit":"600"}],"fail_mode":"open"}`,
			wantStatus: 400,
			wantErrors: []FieldError{
				{Field: "limits[0].limit", Message: "must be an integer"},
				{Field: "name", Message: "must be a string"},
			},
		},
		{
			name: "fractional integer", method: "POST", path: "/v1/plans",
			body:       `{"id":"pro","name":"Pro","limits":[{"metric":"requests","window":"day","limit":1.5}],"fail_mode":"open"}`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "limits[0].limit", Message: "must be an integer"}},
		},
		{
			name: "negative limit", method: "POST", path: "/v1/plans",
			body:       `{"id":"pro","name":"Pro","limits":[{"metric":"requests","window":"day","limit":-1}],"fail_mode":"open"}`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "limits[0].limit", Message: "must be at least 0"}},
		},
		{
			name: "every problem is reported", method: "POST", path: "/v1/orgs",
			body:       `{"id":"acme","name":"","plan":"pro","mode":"fast","billing_anchor_day":29,"x":1}`,
			wantStatus: 400,
			wantErrors: []FieldError{
				{Field: "billing_anchor_day", Message: "must be at most 28"},
				{Field: "mode", Message: "must be one of enforce, shadow, warn"},
				{Field: "name", Message: "must not be empty"},
				{Field: "x", Message: `unknown field "x"`},
			},
		},
		{
			name: "non-JSON body", method: "POST", path: "/v1/plans",
			body:       `{"id": "pro",`,
			wantStatus: 400,
			wantDetail: "request body is not valid JSON: unexpected end of JSON input at line 1, column 13",
			wantErrors: []FieldError{{Field: "body", Message: "is not valid JSON: unexpected end of JSON input at line 1, column 13"}},
		},
		{
			name: "trailing garbage", method: "POST", path: "/v1/plans",
			body:       validPlan + ` x`,
			wantStatus: 400,
			wantDetail: "request body is not valid JSON: invalid character 'x' after top-level value at line 1, column 109",
			wantErrors: []FieldError{{Field: "body", Message: "is not valid JSON: invalid character 'x' after top-level value at line 1, column 109"}},
		},
		{
			name: "body is not an object", method: "POST", path: "/v1/plans",
			body:       `[1]`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "body", Message: "must be an object"}},
		},
		{
			name: "empty body", method: "POST", path: "/v1/plans",
			wantStatus: 400,
			wantDetail: "request body is required",
			wantErrors: []FieldError{{Field: "body", Message: "is required"}},
		},
		{
			name: "curl's default content type is read as JSON", method: "POST", path: "/v1/plans",
			contentType: "application/x-www-form-urlencoded", body: validPlan,
			wantStatus: 299,
		},
		{
			name: "wrong content type", method: "POST", path: "/v1/plans",
			contentType: "text/plain; charset=utf-8", body: validPlan,
			wantStatus: 415,
			wantDetail: `Content-Type must be application/json, not "text/plain; charset=utf-8"`,
		},
		{
			name: "wrong content type without a body", method: "POST", path: "/v1/plans",
			contentType: "multipart/form-data; boundary=x",
			wantStatus:  415,
			wantDetail:  `Content-Type must be application/json, not "multipart/form-data; boundary=x"`,
		},
		{
			name: "patch may null the pricing", method: "PATCH", path: "/v1/plans/pro",
			body:       `{"pricing":null}`,
			wantStatus: 299,
		},
		{
			name: "patch pricing decimal", method: "PATCH", path: "/v1/plans/pro",
			body:       `{"pricing":{"currency":"usd","base_price":"49.00","metrics":[{"metric":"requests","included_units":10,"overage_price":"0,01"}]}}`,
			wantStatus: 400,
			wantErrors: []FieldError{
				{Field: "pricing.currency", Message: "must be a three-letter ISO 4217 currency code in capitals, such as USD"},
				{Field: "pricing.metrics[0].overage_price", Message: "must be a decimal amount such as 49.00: at most 12 digits before the point and 6 after"},
			},
		},
		{
			name: "org patch with null name", method: "PATCH", path: "/v1/orgs/acme",
			body:       `{"name":null}`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "name", Message: "must not be null"}},
		},
		{
			name: "api key scopes", method: "POST", path: "/v1/orgs/acme/api-keys",
			body:       `{"name":"svc","scopes":["check","check","root"]}`,
			wantStatus: 400,
			wantErrors: []FieldError{
				{Field: "scopes", Message: "must not contain duplicates"},
				{Field: "scopes[2]", Message: "must be one of check, admin, billing"},
			},
		},
		{
			name: "api key without scopes", method: "POST", path: "/v1/orgs/acme/api-keys",
			body:       `{"name":"svc","scopes":[]}`,
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "scopes", Message: "must have at least 1 item"}},
		},
		{
			name: "console user email and password", method: "POST", path: "/v1/orgs/acme/console-users",
			body:       `{"email":"not an email","password":"short","role":"admin"}`,
			wantStatus: 400,
			wantErrors: []FieldError{
				{Field: "email", Message: "must be a valid email address"},
				{Field: "password", Message: "must be at least 12 characters long"},
			},
		},
		{
			name: "console user valid", method: "POST", path: "/v1/orgs/acme/console-users",
			body:       `{"email":"ops@acme.example","password":"correct-horse-battery","role":"viewer"}`,
			wantStatus: 299,
		},
		{
			name: "query limit too small", method: "GET", path: "/v1/plans?limit=0",
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "limit", Message: "must be at least 1"}},
		},
		{
			name: "query limit not a number", method: "GET", path: "/v1/orgs/acme/teams?limit=ten",
			wantStatus: 400,
			wantErrors: []FieldError{{Field: "limit", Message: "must be an integer"}},
		},
		{
			name: "query period and format", method: "GET", path: "/v1/orgs/acme/billing/export?period=2026-13&format=xml",
			wantStatus: 400,
			wantErrors: []FieldError{
				{Field: "format", Message: "must be one of csv, json"},
				{Field: "period", Message: "must be a month as YYYY-MM, such as 2026-11"},
			},
		},
		{
			name: "good query passes", method: "GET", path: "/v1/billing/export?period=2026-11&format=csv",
			wantStatus: 299,
		},
		{
			name: "unknown path falls through", method: "GET", path: "/v1/nope",
			wantStatus: 299,
		},
		{
			name: "unknown method falls through", method: "DELETE", path: "/v1/plans/pro",
			wantStatus: 299,
		},
		{
			name: "trailing slash falls through", method: "GET", path: "/v1/plans/",
			wantStatus: 299,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, handled := mustValidated(t)
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req := httptest.NewRequest(tc.method, tc.path, body)
			switch tc.contentType {
			case "":
				if tc.body != "" {
					req.Header.Set("Content-Type", "application/json")
				}
			case "-":
			default:
				req.Header.Set("Content-Type", tc.contentType)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)

			if rec.Code != tc.wantStatus {
				t.Fatalf("status = %d, want %d; body: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			called, got := handled()
			if tc.wantStatus == 299 {
				if !called {
					t.Fatal("handler was not called")
				}
				if got != tc.body {
					t.Errorf("handler read body %q, want %q", got, tc.body)
				}
				return
			}
			if called {
				t.Error("handler was called for an invalid request")
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type = %q, want application/problem+json", ct)
			}
			var p problemBody
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
				t.Fatalf("decode problem: %v; body: %s", err, rec.Body)
			}
			if p.Status != tc.wantStatus || p.Title == "" || p.Type == "" {
				t.Errorf("problem = %+v, want status %d with type and title", p, tc.wantStatus)
			}
			if tc.wantDetail != "" && p.Detail != tc.wantDetail {
				t.Errorf("detail = %q, want %q", p.Detail, tc.wantDetail)
			}
			if diff := cmp.Diff(tc.wantErrors, p.Errors); diff != "" {
				t.Errorf("errors mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRequestValidatorBodyTooLarge(t *testing.T) {
	h, handled := mustValidated(t)
	big := `{"id":"pro","name":"` + strings.Repeat("x", maxValidatedBody) + `"}`
	req := httptest.NewRequest("POST", "/v1/plans", strings.NewReader(big))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status = %d, want 413; body: %s", rec.Code, rec.Body)
	}
	if called, _ := handled(); called {
		t.Error("handler was called")
	}
}

// TestRequestValidatorConcurrent shares one validator between goroutines; run
// with -race.
func TestRequestValidatorConcurrent(t *testing.T) {
	h, _ := mustValidated(t)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				body, want := validPlan, 299
				if (i+j)%2 == 1 {
					body, want = `{"id":"pro","fail_mode":"sometimes"}`, 400
				}
				req := httptest.NewRequest("POST", "/v1/plans", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != want {
					t.Errorf("status = %d, want %d", rec.Code, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}
