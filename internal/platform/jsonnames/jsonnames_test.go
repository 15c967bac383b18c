package jsonnames_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/jsonnames"
	"github.com/quotaplane/quotaplane/internal/platform/jsonnames/jsonnamestest"
)

func TestDuplicate(t *testing.T) {
	many := make([]string, 40)
	for i := range many {
		many[i] = fmt.Sprintf(`"m%d": %d`, i, i)
	}
	for _, tc := range []struct {
		doc, want string // want "" for none
	}{
		{`{"tokens": 3, "tokens": 30}`, "tokens"},
		{`{"org":"a","cost":1,"cost":2}`, "cost"},
		{`{"costs": {"a": 1, "b": 2, "a": 3}}`, "costs.a"},
		{`{"checks": [{"org": "a"}, {"org": "a", "user": "u", "org": "b"}]}`, "checks[1].org"},
		{`{"a": "x", "\u0061": "y"}`, "a"},
		{`{"a": {"b": 1}, "c": {"b": 1}}`, ""},           // the same name in two objects
		{`{"cost": 1, "Cost": 2}`, ""},                   // two names
		{`{"a\"": 1, "a": 2}`, ""},                       // an escaped quote is part of the name
		{`[{"x": [1, {"y": 2, "y": 3}]}]`, "[0].x[1].y"}, // arrays all the way
		{`{"s": "{\"a\":1,\"a\":2}"}`, ""},               // a string that reads like JSON is a string
		{`{` + strings.Join(many, ",") + `}`, ""},
		{`{` + strings.Join(many, ",") + `, "m3": 0}`, "m3"},   // past the linear search
		{`{` + strings.Join(many, ",") + `, "m39": 0}`, "m39"}, // a name the map holds from the start
		{` { } `, ""},
		{`[]`, ""},
		{`12`, ""},
		{`"x"`, ""},
	} {
		if !json.Valid([]byte(tc.doc)) {
			t.Fatalf("%s: not valid JSON", tc.doc)
		}
		got, found := jsonnames.Duplicate([]byte(tc.doc))
		if found != (tc.want != "") || got != tc.want {
			t.Errorf("Duplicate(%.60s) = %q, %v; want %q", tc.doc, got, found, tc.want)
		}
	}
}

func FuzzDuplicate(f *testing.F) {
	f.Add([]byte(`{"a": 1, "a": 2}`))
	f.Add([]byte(`{"a": [{"b": 1}], "c": {"d": {"e": 1, "e": 2}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		_, found := jsonnames.Duplicate(b)
		if want := jsonnamestest.NamedTwice(b); found != want {
			t.Fatalf("%s: found %v, encoding/json's tokens say %v", b, found, want)
		}
	})
}
