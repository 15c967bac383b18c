package tenants

import (
	"encoding/binary"
	"regexp"
	"testing"
)

// tokenShape is the one shape of an org API key: qpk_, the id (16 lower-case hex
// digits), '_', and the secret: 32 bytes in unpadded base64url, whose last character
// carries 2 zero bits (so only A E I M Q U Y c g k o s w 0 4 8 can end it).
var tokenShape = regexp.MustCompile(`^qpk_[0-9a-f]{16}_[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$`)

// Whatever parseToken accepts has exactly the shape of a generated key, and the id it
// returns is the one in the token; the token of any id and secret parses back to its id.
func FuzzParseToken(f *testing.F) {
	for i := range 4 {
		_, tok, err := newToken()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(tok, uint64(i)<<60|uint64(i), []byte(tok))
	}
	for _, s := range []string{
		"", "qpk_", "qpk_0123456789abcdef_", "qpk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"qpk_0123456789ABCDEF_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", // upper-case id
		"qpk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB", // non-zero padding bits
		"qpk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA+A", // standard base64
		"qpk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=A",
		"qpk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\nA",
		"qpk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\xffA",
		"qpk_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", // one too long
		"qpk_0123456789abcdeg_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"QPK_0123456789abcdef_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"qpk_0123456789abcdef-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
		"test-operator-token-0123456789",
	} {
		f.Add(s, uint64(0), []byte(nil))
	}
	f.Fuzz(func(t *testing.T, s string, id uint64, secret []byte) {
		got, ok := parseToken(s)
		if ok != tokenShape.MatchString(s) {
			t.Fatalf("parseToken(%q) = %v; the key shape says %v", s, ok, !ok)
		}
		if ok && got != s[4:20] {
			t.Fatalf("parseToken(%q) = id %q, want %q", s, got, s[4:20])
		}
		if ok != LooksLikeAPIKey(s) {
			t.Fatalf("LooksLikeAPIKey(%q) disagrees with parseToken", s)
		}

		var idb [8]byte
		var sec [32]byte
		binary.BigEndian.PutUint64(idb[:], id)
		copy(sec[:], secret)
		wantID, tok := formatToken(idb, sec)
		if got, ok := parseToken(tok); !ok || got != wantID || !tokenShape.MatchString(tok) {
			t.Fatalf("the token of id %x and secret %x, %q, parses to %q, %v; want %q", idb, sec, tok, got, ok, wantID)
		}
	})
}

// Every key newToken makes parses back to its id.
func TestNewTokenParses(t *testing.T) {
	for range 1000 {
		id, tok, err := newToken()
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := parseToken(tok); !ok || got != id {
			t.Fatalf("parseToken(%q) = %q, %v; want %q", tok, got, ok, id)
		}
	}
}
