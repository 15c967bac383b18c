// Package jsonnamestest is the tests' reference for jsonnames: whether a JSON text
// names a member of one object twice, read with encoding/json's tokens and each
// object's names in a set. Slow and plain, so that a fuzz target can hold the fast
// scanners to it.
package jsonnamestest

import (
	"bytes"
	"encoding/json"
)

// NamedTwice reports whether an object of the valid JSON b names a member twice.
// Invalid JSON reports false once the tokens stop.
func NamedTwice(b []byte) bool {
	type frame struct {
		names map[string]bool // nil for an array
		key   bool            // the next token of this object is a name
	}
	dec := json.NewDecoder(bytes.NewReader(b))
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
