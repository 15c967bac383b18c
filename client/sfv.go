package client

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A small parser of RFC 9651 structured-field Lists, enough for the RateLimit-Policy
// and RateLimit fields of draft-ietf-httpapi-ratelimit-headers-11, so that this module
// stays standard-library only. It follows RFC 9651 section 4.2 for Lists of Items
// with Parameters: integers, decimals, strings, tokens, byte sequences, booleans and
// dates as bare items and parameter values. It refuses (as malformed) what these
// fields never hold: inner lists and display strings. The main module's
// internal/clienttest compares it with github.com/dunglas/httpsfv on valid and invalid
// fields.

// sfKind is the type of a bare item.
type sfKind uint8

const (
	sfInteger sfKind = iota + 1
	sfDecimal
	sfString
	sfToken
	sfBinary
	sfBoolean
	sfDate
)

// sfValue is a bare item.
type sfValue struct {
	kind  sfKind
	num   int64   // integer, date
	dec   float64 // decimal
	str   string  // string, token
	bytes []byte  // binary
	b     bool    // boolean
}

// sfParam is one parameter of an item.
type sfParam struct {
	key string
	val sfValue
}

// sfItem is one member of a List.
type sfItem struct {
	val    sfValue
	params []sfParam
}

// param returns the value of the parameter key.
func (it sfItem) param(key string) (sfValue, bool) {
	for _, p := range it.params {
		if p.key == key {
			return p.val, true
		}
	}
	return sfValue{}, false
}

var errSF = errors.New("malformed structured field")

// parseSFList parses the field values of one field name (each a line of the header,
// combined as RFC 9110 combines them: joined with ", ").
func parseSFList(values []string) ([]sfItem, error) {
	p := &sfParser{s: strings.Join(values, ", ")}
	p.skip(' ')
	var out []sfItem
	for p.i < len(p.s) {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.ows()
		if p.i >= len(p.s) {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("%w: want ',' at %d", errSF, p.i)
		}
		p.i++
		p.ows()
		if p.i >= len(p.s) {
			return nil, fmt.Errorf("%w: trailing ','", errSF)
		}
	}
	return out, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) skip(c byte) {
	for p.i < len(p.s) && p.s[p.i] == c {
		p.i++
	}
}

func (p *sfParser) ows() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	if p.i < len(p.s) && p.s[p.i] == '(' {
		return sfItem{}, fmt.Errorf("%w: an inner list is not an item", errSF)
	}
	v, err := p.bare()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{val: v}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skip(' ')
		k, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		pv := sfValue{kind: sfBoolean, b: true}
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if pv, err = p.bare(); err != nil {
				return sfItem{}, err
			}
		}
		replaced := false
		for j := range it.params { // a repeated key keeps its place, takes the last value
			if it.params[j].key == k {
				it.params[j].val, replaced = pv, true
			}
		}
		if !replaced {
			it.params = append(it.params, sfParam{k, pv})
		}
	}
	return it, nil
}

func isLCAlpha(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool   { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || c >= 'A' && c <= 'Z' }

func (p *sfParser) key() (string, error) {
	if p.i >= len(p.s) || !(isLCAlpha(p.s[p.i]) || p.s[p.i] == '*') {
		return "", fmt.Errorf("%w: want a key at %d", errSF, p.i)
	}
	start := p.i
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !(isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

// tchar is RFC 9110's token character.
func isTChar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func (p *sfParser) bare() (sfValue, error) {
	if p.i >= len(p.s) {
		return sfValue{}, fmt.Errorf("%w: want an item", errSF)
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		start := p.i
		p.i++
		for p.i < len(p.s) && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return sfValue{kind: sfToken, str: p.s[start:p.i]}, nil
	case c == ':':
		end := strings.IndexByte(p.s[p.i+1:], ':')
		if end < 0 {
			return sfValue{}, fmt.Errorf("%w: unterminated byte sequence", errSF)
		}
		enc := p.s[p.i+1 : p.i+1+end]
		for j := 0; j < len(enc); j++ {
			if c := enc[j]; !(isAlpha(c) || isDigit(c) || c == '+' || c == '/' || c == '=') {
				return sfValue{}, fmt.Errorf("%w: bad byte sequence", errSF)
			}
		}
		b, err := base64.StdEncoding.DecodeString(enc)
		if err != nil { // RFC 9651 lets a parser accept missing padding; this one does not
			return sfValue{}, fmt.Errorf("%w: bad byte sequence", errSF)
		}
		p.i += end + 2
		return sfValue{kind: sfBinary, bytes: b}, nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return sfValue{kind: sfBoolean, b: p.s[p.i-1] == '1'}, nil
		}
		return sfValue{}, fmt.Errorf("%w: bad boolean", errSF)
	case c == '@':
		p.i++
		v, err := p.number()
		if err != nil || v.kind != sfInteger {
			return sfValue{}, fmt.Errorf("%w: bad date", errSF)
		}
		return sfValue{kind: sfDate, num: v.num}, nil
	}
	return sfValue{}, fmt.Errorf("%w: unexpected %q at %d", errSF, p.s[p.i], p.i)
}

// number parses an sf-integer (at most 15 digits) or sf-decimal (at most 12 digits,
// a dot, 1 to 3 digits).
func (p *sfParser) number() (sfValue, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits := p.i
	for p.i < len(p.s) && isDigit(p.s[p.i]) {
		p.i++
	}
	intDigits := p.i - digits
	if intDigits == 0 {
		return sfValue{}, fmt.Errorf("%w: want a digit at %d", errSF, p.i)
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		if intDigits > 12 {
			return sfValue{}, fmt.Errorf("%w: decimal too long", errSF)
		}
		p.i++
		frac := p.i
		for p.i < len(p.s) && isDigit(p.s[p.i]) {
			p.i++
		}
		if n := p.i - frac; n < 1 || n > 3 {
			return sfValue{}, fmt.Errorf("%w: a decimal has 1 to 3 fractional digits", errSF)
		}
		d, err := strconv.ParseFloat(p.s[start:p.i], 64)
		if err != nil {
			return sfValue{}, fmt.Errorf("%w: %v", errSF, err)
		}
		return sfValue{kind: sfDecimal, dec: d}, nil
	}
	if intDigits > 15 {
		return sfValue{}, fmt.Errorf("%w: integer too long", errSF)
	}
	n, err := strconv.ParseInt(p.s[start:p.i], 10, 64)
	if err != nil {
		return sfValue{}, fmt.Errorf("%w: %v", errSF, err)
	}
	return sfValue{kind: sfInteger, num: n}, nil
}

func (p *sfParser) str() (sfValue, error) {
	p.i++ // the opening quote
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return sfValue{}, fmt.Errorf("%w: bad escape in string", errSF)
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return sfValue{kind: sfString, str: b.String()}, nil
		case c < 0x20 || c > 0x7e:
			return sfValue{}, fmt.Errorf("%w: bad character in string", errSF)
		default:
			b.WriteByte(c)
		}
	}
	return sfValue{}, fmt.Errorf("%w: unterminated string", errSF)
}
