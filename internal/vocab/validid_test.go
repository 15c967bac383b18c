package vocab_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// ValidID is checked by hand for speed; it must agree with the documented pattern.
func TestValidIDMatchesPattern(t *testing.T) {
	pattern := regexp.MustCompile(vocab.IDPattern)
	ids := []string{"", "a", "acme", "A9", "a.b_c:d@e-f", ".a", "-a", "_a", "a b", "a/b", "a|b", "a\n", "é", "aé",
		"a{b}", strings.Repeat("a", 128), strings.Repeat("a", 129), "0" + strings.Repeat("-", 127), "a\x00"}
	for c := 0; c < 256; c++ {
		ids = append(ids, string(rune(c)), "a"+string([]byte{byte(c)}))
	}
	for _, id := range ids {
		if got, want := vocab.ValidID(id), pattern.MatchString(id); got != want {
			t.Errorf("ValidID(%q) = %v, pattern says %v", id, got, want)
		}
	}
}
