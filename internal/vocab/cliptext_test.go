package vocab_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

func TestClipText(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	l64 := strings.Repeat("x", 64)
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{`team "eng" of org "acme" not found`, `team "eng" of org "acme" not found`},
		{fmt.Sprintf("reservation %q not found", long), `reservation "` + l64 + `…" not found`},
		{fmt.Sprintf("org %q not found", l64), fmt.Sprintf("org %q not found", l64)}, // 64 is kept whole
		{fmt.Sprintf(`unknown field %q`, "a b "+long), `unknown field "a b ` + l64[:60] + `…"`},
		{"no such route: GET /v1/" + long, "no such route: GET /v1/" + l64[:60] + "…"},
		{"costs." + long + ": field named twice (send each field once)", "costs." + l64[:58] + "…: field named twice (send each field once)"},
		{fmt.Sprintf("metric %q: must be", strings.Repeat("é", 100)), "metric \"" + strings.Repeat("é", 64) + `…": must be`},
		{fmt.Sprintf("a %q and %q", long, "b"), `a "` + l64 + `…" and "b"`},
		{`an unclosed "` + long, `an unclosed "` + l64 + `…"`},
		{"must be 1 to 128 characters: letters a-z and A-Z, digits and . _ : @ -, the first a letter or digit",
			"must be 1 to 128 characters: letters a-z and A-Z, digits and . _ : @ -, the first a letter or digit"},
	} {
		if got := vocab.ClipText(tc.in); got != tc.want {
			t.Errorf("ClipText(%.80q) = %.200q, want %.200q", tc.in, got, tc.want)
		}
	}
}
