package readmetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// A pattern is a JSON value the README shows, with `...` wildcards (see the package
// documentation).
type pattern interface{}

type (
	anyValue   struct{} // a bare ...
	objPattern struct {
		keys    []string
		members map[string]pattern
		open    bool // a ... member: other members may be present
	}
	arrPattern []pattern // anyValue elements match any number of elements
	strPattern string    // "..." inside matches any text
)

// parsePattern reads text as a JSON value with wildcards. It fails on anything else,
// so a README answer that is not JSON is compared line by line instead.
func parsePattern(text string) (pattern, error) {
	p := &patternParser{s: text}
	v, err := p.value()
	if err != nil {
		return nil, err
	}
	if p.skip(); p.i != len(p.s) {
		return nil, fmt.Errorf("text after the JSON value at offset %d", p.i)
	}
	return v, nil
}

type patternParser struct {
	s string
	i int
}

func (p *patternParser) skip() {
	for p.i < len(p.s) && strings.ContainsRune(" \t\r\n", rune(p.s[p.i])) {
		p.i++
	}
}

func (p *patternParser) ellipsis() bool {
	p.skip()
	if strings.HasPrefix(p.s[p.i:], "...") {
		p.i += 3
		return true
	}
	return false
}

func (p *patternParser) expect(c byte) error {
	p.skip()
	if p.i >= len(p.s) || p.s[p.i] != c {
		return fmt.Errorf("want %q at offset %d", c, p.i)
	}
	p.i++
	return nil
}

// next reports the next significant byte, 0 at the end.
func (p *patternParser) next() byte {
	p.skip()
	if p.i >= len(p.s) {
		return 0
	}
	return p.s[p.i]
}

func (p *patternParser) value() (pattern, error) {
	if p.ellipsis() {
		return anyValue{}, nil
	}
	switch c := p.next(); {
	case c == '{':
		p.i++
		o := objPattern{members: map[string]pattern{}}
		if p.next() == '}' {
			p.i++
			return o, nil
		}
		for {
			if p.ellipsis() {
				o.open = true
			} else {
				key, err := p.str()
				if err != nil {
					return nil, err
				}
				if err := p.expect(':'); err != nil {
					return nil, err
				}
				v, err := p.value()
				if err != nil {
					return nil, err
				}
				if _, dup := o.members[key]; dup {
					return nil, fmt.Errorf("member %q twice", key)
				}
				o.keys = append(o.keys, key)
				o.members[key] = v
			}
			switch p.next() {
			case ',':
				p.i++
			case '}':
				p.i++
				return o, nil
			default:
				return nil, fmt.Errorf("want ',' or '}' at offset %d", p.i)
			}
		}
	case c == '[':
		p.i++
		a := arrPattern{}
		if p.next() == ']' {
			p.i++
			return a, nil
		}
		for {
			v, err := p.value()
			if err != nil {
				return nil, err
			}
			a = append(a, v)
			switch p.next() {
			case ',':
				p.i++
			case ']':
				p.i++
				return a, nil
			default:
				return nil, fmt.Errorf("want ',' or ']' at offset %d", p.i)
			}
		}
	case c == '"':
		s, err := p.str()
		return strPattern(s), err
	default:
		start := p.i
		for p.i < len(p.s) && strings.ContainsRune("+-.0123456789eEtruefalsn", rune(p.s[p.i])) {
			p.i++
		}
		var v any
		d := json.NewDecoder(strings.NewReader(p.s[start:p.i]))
		d.UseNumber()
		if start == p.i || d.Decode(&v) != nil || d.InputOffset() != int64(p.i-start) {
			return nil, fmt.Errorf("not a JSON value at offset %d", start)
		}
		return v, nil
	}
}

func (p *patternParser) str() (string, error) {
	if p.next() != '"' {
		return "", fmt.Errorf("want a string at offset %d", p.i)
	}
	start := p.i
	for p.i++; p.i < len(p.s); p.i++ {
		switch p.s[p.i] {
		case '\\':
			p.i++
		case '"':
			p.i++
			var s string
			if err := json.Unmarshal([]byte(p.s[start:p.i]), &s); err != nil {
				return "", fmt.Errorf("string at offset %d: %v", start, err)
			}
			return s, nil
		}
	}
	return "", fmt.Errorf("string at offset %d never ends", start)
}

// parseJSONValues decodes body as one or more JSON values (numbers kept exact).
func parseJSONValues(body string) ([]any, error) {
	d := json.NewDecoder(strings.NewReader(body))
	d.UseNumber()
	var out []any
	for {
		var v any
		err := d.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.New("no JSON value")
	}
	return out, nil
}

// matchValue reports why got does not match want ("" when it does); at is the path.
func matchValue(at string, want pattern, got any) string {
	switch w := want.(type) {
	case anyValue:
		return ""
	case objPattern:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: want an object, got %s", at, show(got))
		}
		for _, k := range w.keys {
			v, ok := g[k]
			if !ok {
				return fmt.Sprintf("%s: member %q is missing", at, k)
			}
			if why := matchValue(at+"."+k, w.members[k], v); why != "" {
				return why
			}
		}
		if !w.open {
			for k := range g {
				if _, ok := w.members[k]; !ok {
					return fmt.Sprintf("%s: member %q is not shown (add it, or ... to the object)", at, k)
				}
			}
		}
		return ""
	case arrPattern:
		g, ok := got.([]any)
		if !ok {
			return fmt.Sprintf("%s: want an array, got %s", at, show(got))
		}
		if why := matchArray(at, w, 0, g, 0); why != "" {
			return why
		}
		return ""
	case strPattern:
		g, ok := got.(string)
		if !ok {
			return fmt.Sprintf("%s: want a string, got %s", at, show(got))
		}
		if !globMatch(string(w), g) {
			return fmt.Sprintf("%s: want %q, got %q", at, string(w), g)
		}
		return ""
	case json.Number:
		g, ok := got.(json.Number)
		if !ok {
			return fmt.Sprintf("%s: want %s, got %s", at, w, show(got))
		}
		wf, _ := strconv.ParseFloat(string(w), 64)
		gf, _ := strconv.ParseFloat(string(g), 64)
		if wf != gf {
			return fmt.Sprintf("%s: want %s, got %s", at, w, g)
		}
		return ""
	default: // true, false, null
		if want != got {
			return fmt.Sprintf("%s: want %s, got %s", at, show(want), show(got))
		}
		return ""
	}
}

// matchArray matches want[i:] against got[j:]; a bare ... element takes any number
// of elements.
func matchArray(at string, want arrPattern, i int, got []any, j int) string {
	for i < len(want) {
		if _, ok := want[i].(anyValue); ok {
			for k := j; k <= len(got); k++ {
				if matchArray(at, want, i+1, got, k) == "" {
					return ""
				}
			}
			return fmt.Sprintf("%s: no way to match %d elements", at, len(got))
		}
		if j >= len(got) {
			return fmt.Sprintf("%s: want element [%d], the array has %d", at, j, len(got))
		}
		if why := matchValue(fmt.Sprintf("%s[%d]", at, j), want[i], got[j]); why != "" {
			return why
		}
		i, j = i+1, j+1
	}
	if j != len(got) {
		return fmt.Sprintf("%s: %d elements, the README shows %d (add them, or ... to the array)", at, len(got), j)
	}
	return ""
}

func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 200 {
		return string(b[:200]) + "..."
	}
	return string(b)
}

// globMatch reports whether s matches pattern, in which each ... stands for any text.
func globMatch(pattern, s string) bool {
	parts := strings.Split(pattern, "...")
	expr := make([]string, len(parts))
	for i, p := range parts {
		expr[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile(`(?s)\A` + strings.Join(expr, ".*") + `\z`).MatchString(s)
}

// matchLines compares text line by line: each line a glob, a line that is only ...
// any number of lines. Trailing white space and trailing empty lines do not count.
func matchLines(want, got string) string {
	w := trimLines(want)
	g := trimLines(got)
	var try func(i, j int) bool
	try = func(i, j int) bool {
		for i < len(w) {
			if w[i] == "..." {
				for k := j; k <= len(g); k++ {
					if try(i+1, k) {
						return true
					}
				}
				return false
			}
			if j >= len(g) || !globMatch(w[i], g[j]) {
				return false
			}
			i, j = i+1, j+1
		}
		return j == len(g)
	}
	if try(0, 0) {
		return ""
	}
	return fmt.Sprintf("the lines differ:\n--- README\n%s\n--- got\n%s", strings.Join(w, "\n"), strings.Join(g, "\n"))
}

func trimLines(s string) []string {
	lines := strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n")
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " \t\r")
	}
	for len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

// matchBody compares a body with what the README shows: structurally when the README
// shows JSON, line by line otherwise.
func matchBody(want, got string) string {
	if strings.TrimSpace(want) == "" {
		return ""
	}
	pat, err := parsePattern(want)
	if err != nil {
		return matchLines(want, got)
	}
	vals, err := parseJSONValues(got)
	if err != nil {
		return fmt.Sprintf("the README shows JSON, the answer is not: %v\n%s", err, got)
	}
	if len(vals) != 1 {
		return fmt.Sprintf("the answer holds %d JSON values, the README shows one", len(vals))
	}
	return matchValue("$", pat, vals[0])
}

// response is a parsed curl -i output, or just a body.
type response struct {
	statusLine string // "" when curl did not print one
	header     []string
	body       string
}

// splitResponse splits text that starts with a status line into the status line,
// the header lines and the body.
func splitResponse(text string) response {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	if !strings.HasPrefix(text, "HTTP/") {
		return response{body: text}
	}
	head, body, _ := strings.Cut(text, "\n\n")
	lines := strings.Split(head, "\n")
	return response{statusLine: lines[0], header: lines[1:], body: body}
}

// matchAnswer compares what a command printed with what the README shows for it.
func matchAnswer(want, got string) string {
	w, g := splitResponse(want), splitResponse(got)
	if w.statusLine != "" {
		if g.statusLine == "" {
			return "the README shows a status line; the command printed none"
		}
		if !globMatch(strings.TrimSpace(w.statusLine), strings.TrimSpace(g.statusLine)) {
			return fmt.Sprintf("status line: want %q, got %q", w.statusLine, g.statusLine)
		}
		for _, h := range w.header {
			name, value, ok := strings.Cut(h, ":")
			if !ok {
				return fmt.Sprintf("README header line %q has no ':'", h)
			}
			found := false
			for _, gh := range g.header {
				gname, gvalue, _ := strings.Cut(gh, ":")
				if strings.EqualFold(strings.TrimSpace(gname), strings.TrimSpace(name)) &&
					globMatch(strings.TrimSpace(value), strings.TrimSpace(gvalue)) {
					found = true
					break
				}
			}
			if !found {
				return fmt.Sprintf("header %q: not in the answer's headers:\n%s", h, strings.Join(g.header, "\n"))
			}
		}
	}
	return matchBody(w.body, g.body)
}

// statusOnly matches an answer shown as just a status: "204" or "204 No Content".
var statusOnly = regexp.MustCompile(`\A([1-5][0-9][0-9])( [A-Za-z' -]+)?\z`)

// wantStatus is the status the README implies for an answer without a status line:
// a status shown alone, a problem document's status, else any 2xx (0).
func wantStatus(want string) int {
	if m := statusOnly.FindStringSubmatch(strings.TrimSpace(want)); m != nil {
		s, _ := strconv.Atoi(m[1])
		return s
	}
	pat, err := parsePattern(splitResponse(want).body)
	if err != nil {
		return 0
	}
	o, ok := pat.(objPattern)
	if !ok {
		return 0
	}
	if _, isProblem := o.members["type"]; !isProblem {
		return 0
	}
	n, ok := o.members["status"].(json.Number)
	if !ok {
		return 0
	}
	s, _ := strconv.Atoi(string(n))
	return s
}
