package jsonnames_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/jsonnames"
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
		if want := anyDuplicate(b); found != want {
			t.Fatalf("%s: found %v, encoding/json's tokens say %v", b, found, want)
		}
	})
}

// anyDuplicate is Duplicate's oracle: encoding/json's tokens, each object's names in a set.
func anyDuplicate(b []byte) bool {
	type frame struct {
		names map[string]bool // nil for an array
		key   bool            // the next token of this object is a name
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].names != nil {
				stack[len(stack)-1].key = true
			}
			continue
		}
		if top != nil && top.names != nil && top.key {
			name := tok.(string)
			if top.names[name] {
				return true
			}
			top.names[name], top.key = true, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{names: map[string]bool{}, key: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		default:
			if top != nil && top.names != nil {
				top.key = true
			}
		}
	}
}
