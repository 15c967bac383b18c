package vocab

import "strconv"

// MaxEcho is the most characters of a value a caller sent that an error message or a
// header repeats back to it: enough to recognise the value, never a megabyte echoed
// whole (an id may be up to 128 characters; a longer one is shown cut).
const MaxEcho = 64

// Clip is s cut to its first MaxEcho characters (runes; a byte that is not UTF-8 is
// one), with "…" marking a cut. Clip of a value of at most MaxEcho characters is the
// value.
func Clip(s string) string {
	n := 0
	for i := range s {
		if n == MaxEcho {
			return s[:i] + "…"
		}
		n++
	}
	return s
}

// Quote is Clip(s) quoted as %q quotes a string: what a message says of a value a
// caller sent.
func Quote(s string) string { return strconv.Quote(Clip(s)) }
