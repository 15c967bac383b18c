package vocab

import (
	"strconv"
	"unicode/utf8"
)

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

// ClipText is a message with every value in it cut as Clip cuts it: a quoted value
// ("..." as %q writes it, escapes counted as one character) of more than MaxEcho
// characters, and any run of more than MaxEcho characters without a space or a quote
// (a value written unquoted: a path, a field's name), a ':', ',' or ';' ending it
// kept. The service's own words are never that long, so what a message says of its
// own is kept. Every HTTP error's text passes it (internal/platform/problem), so no
// answer repeats more of a value than MaxEcho, whoever wrote the message.
func ClipText(text string) string {
	if len(text) <= MaxEcho {
		return text // fewer bytes than characters allowed: nothing to cut
	}
	var b []byte // allocated at the first cut
	cut := func(i int, keep, end string) {
		if b == nil {
			b = append(make([]byte, 0, min(len(text), 4096)), text[:i]...)
		}
		b = append(append(b, keep...), end...)
	}
	for i := 0; i < len(text); {
		if text[i] == '"' { // a quoted value: to its closing quote, escapes skipped
			j, n, at := i+1, 0, -1
			for j < len(text) && text[j] != '"' {
				if n == MaxEcho {
					at = j
				}
				if text[j] == '\\' && j+1 < len(text) {
					j++
				}
				_, size := utf8.DecodeRuneInString(text[j:])
				j += size
				n++
			}
			if j < len(text) {
				j++ // the closing quote
			}
			if at >= 0 {
				cut(i, text[i:at], `…"`)
			} else if b != nil {
				b = append(b, text[i:j]...)
			}
			i = j
			continue
		}
		j, n, at := i, 0, -1 // a run of characters without a space or a quote
		for j < len(text) && text[j] != ' ' && text[j] != '"' {
			if n == MaxEcho {
				at = j
			}
			_, size := utf8.DecodeRuneInString(text[j:])
			j += size
			n++
		}
		if j == i { // a space
			j++
		}
		if at >= 0 {
			end := "…"
			if c := text[j-1]; c == ':' || c == ',' || c == ';' { // the sentence's, not the value's
				end += string(c)
			}
			cut(i, text[i:at], end)
		} else if b != nil {
			b = append(b, text[i:j]...)
		}
		i = j
	}
	if b == nil {
		return text
	}
	return string(b)
}
