// Package jsonnames finds an object member named twice in a JSON document. The
// contract refuses such a body (a gateway reading the first and the service the last
// must never disagree about what was charged), and encoding/json keeps the last
// without a word, so every route family that reads a body asks here first.
package jsonnames

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Duplicate returns the path of the first member of an object in b whose name an
// earlier member of the same object has ("tokens", "costs.tokens", "checks[1].cost"),
// and whether there is one. b must be valid JSON (json.Valid). Names compare as
// encoding/json decodes them (escapes resolved: "a" and "\u0061" are one name), and
// case matters ("cost" and "Cost" are two names, which the strict decoders refuse
// as unknown fields anyway).
func Duplicate(b []byte) (string, bool) {
	s := scanner{b: b}
	if _, found := s.value(0); found {
		return s.pathString(), true
	}
	return "", false
}

// scanner walks valid JSON. On a duplicate it stops, and path holds the steps to it.
type scanner struct {
	b    []byte
	path []step
	keys []string // the names of the objects being walked, each object's after the last's
}

// step is an object member's name, or an array index (key "", index >= 0).
type step struct {
	key   string
	index int
}

func (s *scanner) pathString() string {
	var sb strings.Builder
	for _, st := range s.path {
		switch {
		case st.index >= 0:
			sb.WriteString("[" + strconv.Itoa(st.index) + "]")
		case sb.Len() > 0:
			sb.WriteString("." + st.key)
		default:
			sb.WriteString(st.key)
		}
	}
	return sb.String()
}

// value walks the value at b[i] and returns the index after it, or found.
func (s *scanner) value(i int) (int, bool) {
	i = s.space(i)
	switch s.b[i] {
	case '{':
		return s.object(i)
	case '[':
		i = s.space(i + 1)
		if s.b[i] == ']' {
			return i + 1, false
		}
		for n := 0; ; n++ {
			s.path = append(s.path, step{index: n})
			j, found := s.value(i)
			if found {
				return 0, true
			}
			s.path = s.path[:len(s.path)-1]
			j = s.space(j)
			if s.b[j] == ']' {
				return j + 1, false
			}
			i = j + 1 // after the comma
		}
	case '"':
		return s.str(i), false
	}
	j := i // a number, true, false or null
	for j < len(s.b) && !strings.ContainsRune(" \t\r\n,]}", rune(s.b[j])) {
		j++
	}
	return j, false
}

// object walks the object at b[i].
func (s *scanner) object(i int) (int, bool) {
	mark := len(s.keys)
	defer func() { s.keys = s.keys[:mark] }()
	var seen map[string]struct{} // past a few names, looked up instead of compared in turn
	i = s.space(i + 1)
	if s.b[i] == '}' {
		return i + 1, false
	}
	for {
		end := s.str(i)
		name := keyName(s.b[i+1 : end-1])
		dup := false
		if seen != nil {
			_, dup = seen[name]
			seen[name] = struct{}{}
		} else {
			for _, k := range s.keys[mark:] {
				if k == name {
					dup = true
					break
				}
			}
			s.keys = append(s.keys, name)
			if len(s.keys)-mark > 16 {
				seen = make(map[string]struct{}, 32)
				for _, k := range s.keys[mark:] {
					seen[k] = struct{}{}
				}
			}
		}
		s.path = append(s.path, step{key: name, index: -1})
		if dup {
			return 0, true
		}
		j, found := s.value(s.space(end) + 1) // after the colon
		if found {
			return 0, true
		}
		s.path = s.path[:len(s.path)-1]
		j = s.space(j)
		if s.b[j] == '}' {
			return j + 1, false
		}
		i = s.space(j + 1) // after the comma
	}
}

// str returns the index after the string at b[i].
func (s *scanner) str(i int) int {
	for j := i + 1; ; j++ {
		switch s.b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
}

func (s *scanner) space(i int) int {
	for i < len(s.b) && (s.b[i] == ' ' || s.b[i] == '\t' || s.b[i] == '\n' || s.b[i] == '\r') {
		i++
	}
	return i
}

// keyName is the name raw (between its quotes) as encoding/json decodes it.
func keyName(raw []byte) string {
	plain := true
	for _, c := range raw {
		if c == '\\' || c >= 0x80 {
			plain = false
			break
		}
	}
	if plain {
		return string(raw)
	}
	var name string
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	_ = json.Unmarshal(q, &name)
	return name
}
