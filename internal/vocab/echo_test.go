package vocab

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Clip keeps a value of up to MaxEcho characters and cuts a longer one to MaxEcho,
// counting characters, not bytes; Quote quotes what Clip keeps.
func TestClip(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"", ""},
		{"alice", "alice"},
		{strings.Repeat("a", 64), strings.Repeat("a", 64)},
		{strings.Repeat("a", 65), strings.Repeat("a", 64) + "…"},
		{strings.Repeat("ü", 65), strings.Repeat("ü", 64) + "…"},
		{strings.Repeat("\xff", 1<<20), strings.Repeat("\xff", 64) + "…"},
	} {
		if got := Clip(c.in); got != c.want {
			t.Errorf("Clip(%d bytes) = %q, want %q", len(c.in), got, c.want)
		}
	}
	if got := Quote(strings.Repeat("x", 1<<20)); got != `"`+strings.Repeat("x", 64)+`…"` {
		t.Errorf("Quote of 1 MiB = %d characters %q", utf8.RuneCountInString(got), got)
	}
	if got := Quote(`say "hi"`); got != `"say \"hi\""` {
		t.Errorf("Quote = %s", got)
	}
}
