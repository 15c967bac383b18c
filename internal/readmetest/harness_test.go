package readmetest

import (
	"strings"
	"testing"
)

// The comparison must refuse what the README does not show: a harness that accepts
// anything would let the README drift.
func TestMatchAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, want, got string
		ok              bool
	}{
		{"same JSON, other layout", `{"a": 1, "b": [true, null]}`, `{"b":[true,null],"a":1}`, true},
		{"a value differs", `{"a": 1}`, `{"a":2}`, false},
		{"a member not shown", `{"a": 1}`, `{"a":1,"b":2}`, false},
		{"... allows other members", `{"a": 1, ...}`, `{"a":1,"b":2}`, true},
		{"a member shown but missing", `{"a": 1, "c": 3, ...}`, `{"a":1,"b":2}`, false},
		{"... as a value", `{"a": ..., "b": 2}`, `{"a":{"x":[1]},"b":2}`, true},
		{"... in a string", `{"s": "abc...xyz"}`, `{"s":"abc-123-xyz"}`, true},
		{"... in a string, wrong prefix", `{"s": "abd..."}`, `{"s":"abc-123"}`, false},
		{"array in order", `[1, 2]`, `[2,1]`, false},
		{"... elements", `[1, ..., 4]`, `[1,2,3,4]`, true},
		{"... elements, none", `[1, ...]`, `[1]`, true},
		{"an element too many", `[1]`, `[1,2]`, false},
		{"numbers by value", `{"n": 1.50}`, `{"n":1.5}`, true},
		{"JSON shown, text got", `{"a": 1}`, `a,b`, false},
		{"lines", "a,b\n...,2", "a,b\n2026-11,2\n", true},
		{"lines differ", "a,b\n...,2", "a,b\n2026-11,3", false},
		{"a line too many", "a,b", "a,b\nc,d", false},
		{"status line and headers", "HTTP/1.1 200 OK\nX-A: 1\nX-B: ...\n\n{\"ok\": true}",
			"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-B: 42\r\nX-A: 1\r\n\r\n{\"ok\":true}\n", true},
		{"a header value differs", "HTTP/1.1 200 OK\nX-A: 1\n\n{}", "HTTP/1.1 200 OK\r\nX-A: 2\r\n\r\n{}", false},
		{"a header missing", "HTTP/1.1 200 OK\nX-A: 1\n\n{}", "HTTP/1.1 200 OK\r\n\r\n{}", false},
		{"status differs", "HTTP/1.1 200 OK\n\n{}", "HTTP/1.1 429 Too Many Requests\r\n\r\n{}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why := matchAnswer(tc.want, tc.got)
			if (why == "") != tc.ok {
				t.Errorf("matchAnswer(%q, %q) = %q, want ok=%v", tc.want, tc.got, why, tc.ok)
			}
		})
	}
}

func TestWantStatus(t *testing.T) {
	for want, status := range map[string]int{
		``:                                  0,
		`{"a": 1}`:                          0,
		`{"type": "x", "status": 422, ...}`: 422,
		"HTTP/1.1 404 Not Found\n\n{}":      0,
		"period,org\n...":                   0,
		"204":                               204,
		"404 Not Found":                     404,
		"2026":                              0,
	} {
		if got := wantStatus(want); got != status {
			t.Errorf("wantStatus(%q) = %d, want %d", want, got, status)
		}
	}
}

func TestExtract(t *testing.T) {
	readme := strings.Join([]string{
		"# Title",
		"```sh",
		"make run   # not the API",
		"```",
		"",
		"```sh",
		"OP=...   # operator token",
		"",
		"# a comment that describes",
		`curl -s -X POST localhost:8080/v1/plans -H "Authorization: Bearer $OP" -d '{`,
		`  "id": "pro"}'`,
		"# {\"id\": \"pro\",",
		"#  ...}",
		"",
		`curl -s localhost:8080/v1/orgs \`,
		`  -H "Authorization: Bearer $OP"`,
		"```",
		"",
		"```",
		"HTTP/1.1 200 OK",
		"```",
		"Prose.",
		"",
		"```json",
		`{"not": "an answer"}`,
		"```",
	}, "\n")
	examples, holders, err := extract(readme)
	if err != nil {
		t.Fatal(err)
	}
	if len(holders) != 1 || holders[0].name != "OP" || holders[0].line != 7 {
		t.Errorf("placeholders %+v", holders)
	}
	if len(examples) != 2 {
		t.Fatalf("%d examples, want 2: %+v", len(examples), examples)
	}
	if e := examples[0]; e.line != 10 || !strings.HasSuffix(e.command, `"id": "pro"}'`) || e.expected != "{\"id\": \"pro\",\n ...}" {
		t.Errorf("first example %+v", e)
	}
	if e := examples[1]; e.line != 15 || !strings.Contains(e.command, "\n  -H") || e.expected != "HTTP/1.1 200 OK" {
		t.Errorf("second example %+v", e)
	}
	if _, _, err := extract("```sh\ncurl -d '{\n```\n"); err == nil {
		t.Error("an unclosed quote was accepted")
	}
}
