package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/jsonnames/jsonnamestest"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
)

// referenceDecode is the contract of a request body, by encoding/json and reflection
// alone: exactly one JSON value, nothing after it but white space, and every object
// key of the request's own objects, at any level, exactly the json tag of one of its
// fields (encoding/json would take "ORG" for org); the keys of a map (costs: metric
// names) are the caller's; and no object names a member twice.
func referenceDecode(b []byte, v any) error {
	if json.Valid(b) && jsonnamestest.NamedTwice(b) {
		return errors.New("a field named twice")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if len(bytes.TrimLeft(b[dec.InputOffset():], " \t\r\n")) > 0 {
		return errors.New("trailing data")
	}
	var doc any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&doc); err != nil {
		return err
	}
	return exactKeys(doc, reflect.TypeOf(v))
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// exactKeys checks that the keys of every object of doc that is decoded into a struct
// of type t are exactly json tags of its fields.
func exactKeys(doc any, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil // a union (commit's used): the handler reads it
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, _ := doc.(map[string]any)
		fields := map[string]reflect.Type{}
		for i := range t.NumField() {
			if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
				fields[name] = t.Field(i).Type
			}
		}
		for k, x := range obj {
			ft, ok := fields[k]
			if !ok {
				return fmt.Errorf("unknown field %q", k)
			}
			if err := exactKeys(x, ft); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, _ := doc.(map[string]any)
		for _, x := range obj {
			if err := exactKeys(x, t.Elem()); err != nil {
				return err
			}
		}
	case reflect.Slice:
		arr, _ := doc.([]any)
		for _, x := range arr {
			if err := exactKeys(x, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

// The check and reservation routes' decoders (for the checks a hand-written fast path,
// and decodeStrict) accept exactly the bodies of the contract (referenceDecode), decode
// them to the same request as encoding/json, and refuse the others in the API's terms: a
// 400 naming the field at fault, never in Go's words.
func FuzzDecodeCheckBodyLikeTheContract(f *testing.F) {
	for _, s := range []string{
		`{"org":"acme","team":"eng","user":"alice","metric":"requests","cost":3,"idempotency_key":"order-12345"}`,
		`{"org":"acme"}`, ` { "org" : "a" , "cost" : 0 } `, `{"org":"a","cost":-1}`, `{"org":"a","cost":1e3}`,
		`{"org":"a","org":"b"}`, `{"ORG":"a"}`, `{"org":"a\u0041"}`, `{"org":"a"} x`, `{"org":"a"}]`, `{"org":"a"}}`,
		`{"org":"a"}{"org":"b"}`, `{"org":"a"} `, `{"org":"a","cost":9223372036854775808}`, `{"org":"a","cost":-0}`,
		`{"checks":[{"org":"a"},{"org":"b","cost":2}]}`, `{"checks":[]}`, `{"checks":[{"org":"a"}]}]`, `{"checks":null}`,
		`{"org":null}`, `{"org":"a","cost":01}`, `{"org":"a","extra":1}`, `[]`, `null`, `""`, ``, `{`, "{\"org\":\"\xff\"}",
		`{"cost":1,"Cost":500,"org":"a"}`, `{"org":"a","Cost":7}`, `{"\u006frg":"a"}`, `{"checks":[{"org":"a","Cost":1}]}`,
		`{"Checks":[{"org":"a"}]}`, `{"org":"a","cost":1e400}`, `{"org":"a","costs":{"Tokens":1,"tokens":2}}`,
		`{"org":"a","costs":{"t":1e400}}`, "\xef\xbb\xbf{\"org\":\"a\"}", `{"org":"a","cost":-01}`,
		`{"org":"a","metric":"t","amount":1,"ttl_seconds":30,"on_expiry":"release"}`, `{"org":"a","Amount":1}`,
		`{"org":"a","amounts":{"t":1}}`, `{"ttl_seconds":30}`, `{"TTL_SECONDS":30}`, `{"ttl_seconds":1e400}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var got, want api.CheckRequest
		ok, detail := runDecoder(b, func(w *httptest.ResponseRecorder, r *http.Request) bool { return decodeCheck(w, r, &got) })
		compare(t, b, ok, detail, referenceDecode(b, &want), got, want)

		var gotBatch, wantBatch api.BatchCheckRequest
		ok, detail = runDecoder(b, func(w *httptest.ResponseRecorder, r *http.Request) bool { return decodeBatch(w, r, &gotBatch) })
		compare(t, b, ok, detail, referenceDecode(b, &wantBatch), gotBatch, wantBatch)

		var gotRes, wantRes api.ReservationRequest
		ok, detail = runDecoder(b, func(w *httptest.ResponseRecorder, r *http.Request) bool {
			return decodeShaped(w, r, &gotRes, reservationShape)
		})
		compare(t, b, ok, detail, referenceDecode(b, &wantRes), gotRes, wantRes)

		var gotExt, wantExt api.ExtendRequest
		ok, detail = runDecoder(b, func(w *httptest.ResponseRecorder, r *http.Request) bool {
			return decodeShaped(w, r, &gotExt, extendShape)
		})
		compare(t, b, ok, detail, referenceDecode(b, &wantExt), gotExt, wantExt)
	})
}

// runDecoder runs dec on a request with body b, capped as limitBody caps it, and
// returns whether it accepted the body or else the detail of its 400 problem.
func runDecoder(b []byte, dec func(*httptest.ResponseRecorder, *http.Request) bool) (bool, string) {
	w := httptest.NewRecorder()
	r := &http.Request{Method: http.MethodPost, Header: http.Header{}}
	r.Body = http.MaxBytesReader(w, io.NopCloser(bytes.NewReader(b)), MaxBodyBytes)
	if dec(w, r) {
		return true, ""
	}
	var p problem.Document
	_ = json.Unmarshal(w.Body.Bytes(), &p)
	if w.Code != 400 || p.Status != 400 || len(p.Errors) == 0 {
		return false, "unexpected answer " + w.Body.String()
	}
	// A field name the caller sent is echoed back in its own words (an unknown field
	// "[]" is named as such, "\xfc[]" as "\ufffd[]", "\u005b]" as "[]"): only the rest of
	// the answer must avoid Go's.
	answer := w.Body.String()
	sent := stringsIn(b)
	for _, e := range p.Errors {
		if e.Field != "" && containsAny(sent, e.Field) {
			q, _ := json.Marshal(e.Field)
			answer = strings.ReplaceAll(answer, string(q), `""`)
			answer = strings.ReplaceAll(answer, strings.Trim(string(q), `"`), "")
		}
	}
	if leak := goWords(answer); leak != "" {
		return false, "Go's words (" + leak + ") in " + w.Body.String()
	}
	return false, p.Detail
}

// stringsIn returns every JSON string literal in b (well-formed or not around it),
// decoded as encoding/json decodes it: escapes resolved, invalid UTF-8 as U+FFFD.
func stringsIn(b []byte) []string {
	var out []string
	for i := 0; i < len(b); i++ {
		if b[i] != '"' {
			continue
		}
		j := i + 1
		for j < len(b) && b[j] != '"' {
			if b[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(b) {
			break
		}
		var s string
		if json.Unmarshal(b[i:j+1], &s) == nil {
			out = append(out, s)
		}
		i = j
	}
	return out
}

func containsAny(haystacks []string, needle string) bool {
	for _, h := range haystacks {
		if strings.Contains(h, needle) {
			return true
		}
	}
	return false
}

func compare[T any](t *testing.T, b []byte, ok bool, detail string, refErr error, got, want T) {
	t.Helper()
	switch {
	case ok && refErr != nil:
		t.Fatalf("%q accepted; the contract refuses it: %v", b, refErr)
	case !ok && refErr == nil:
		t.Fatalf("%q refused (%s); the contract accepts it as %+v", b, detail, want)
	case ok:
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("%q decodes differently (-reference +server):\n%s", b, diff)
		}
	case strings.HasPrefix(detail, "unexpected answer") || strings.HasPrefix(detail, "Go's words"):
		t.Fatalf("%q refused with %s", b, detail)
	}
}

// goWords returns the first trace of Go's own vocabulary in s: encoding/json's "json:"
// prefix, "Go struct", "Go value" or a Go type name, or "" when there is none.
func goWords(s string) string {
	for _, w := range []string{"json:", "Go struct", "Go value", "int64", "int32", "float64", "[]", "api.", "struct", "EOF", "unmarshal"} {
		if strings.Contains(s, w) {
			return w
		}
	}
	return ""
}
