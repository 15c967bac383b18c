package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// The check and reservation routes are not validated against the spec (routes.go), and
// encoding/json, which decodes their bodies when the hand-written fast path declines,
// matches field names regardless of case: {"ORG":"a"} was org, {"cost":1,"Cost":500}
// counted 500. The contract refuses a field that is not one of the request's, so
// decodeStrict first walks the body along the request's shape: a field name must be
// exactly one of the object's, and an integer field must hold an integer within its
// bounds. What is left (a string field of another type, the body not an object) is
// decodeBytes', worded as on the admin routes.

// shapeKind is what a shape admits.
type shapeKind uint8

const (
	anyValue     shapeKind = iota // left to encoding/json
	objectOf                      // an object of fields, each exactly as named
	arrayOf                       // an array of elem
	mapOf                         // an object of the caller's keys (metrics), each an elem
	integer                       // an integer from lo to hi (or null, which encoding/json leaves unset)
	integerOrMap                  // an integer, or a map of elem (commit's used)
)

// shape is the JSON a request may hold at one place.
type shape struct {
	kind   shapeKind
	fields map[string]*shape
	elem   *shape
	lo, hi int64
}

var (
	idShape    = &shape{kind: anyValue}
	plainShape = &shape{kind: anyValue} // a number or a boolean, as encoding/json reads it
	unitsShape = &shape{kind: integer, lo: 0, hi: vocab.MaxUnits}
	ttlShape   = &shape{kind: integer, lo: 1, hi: int64(checks.MaxReservationTTL / time.Second)}

	checkShape = &shape{kind: objectOf, fields: map[string]*shape{
		"org": idShape, "team": idShape, "user": idShape, "metric": idShape, "idempotency_key": idShape,
		"cost": unitsShape, "costs": {kind: mapOf, elem: unitsShape},
	}}
	batchShape       = &shape{kind: objectOf, fields: map[string]*shape{"checks": {kind: arrayOf, elem: checkShape}}}
	reservationShape = &shape{kind: objectOf, fields: map[string]*shape{
		"org": idShape, "team": idShape, "user": idShape, "metric": idShape, "idempotency_key": idShape,
		"amount": {kind: integer, lo: 1, hi: vocab.MaxUnits}, "amounts": {kind: mapOf, elem: unitsShape},
		"ttl_seconds": ttlShape, "on_expiry": idShape,
	}}
	commitShape = &shape{kind: objectOf, fields: map[string]*shape{
		"used": {kind: integerOrMap, lo: 0, hi: vocab.MaxUnits, elem: unitsShape},
	}}
	extendShape = &shape{kind: objectOf, fields: map[string]*shape{"ttl_seconds": ttlShape}}
	leaseShape  = &shape{kind: objectOf, fields: map[string]*shape{
		"org": idShape, "team": idShape, "user": idShape, "metric": idShape, "rate": plainShape,
	}}
	leaseSettleShape = &shape{kind: objectOf, fields: map[string]*shape{
		"used": unitsShape, "renew": plainShape, "rate": plainShape,
	}}
)

// decodeShaped is decode for the reservation routes: the body read, then decodeStrict.
func decodeShaped(w http.ResponseWriter, r *http.Request, v any, sh *shape) bool {
	b, ok := readBody(w, r)
	if !ok {
		return false
	}
	if err := decodeStrict(b, v, sh); err != nil {
		refuse(w, r, err)
		return false
	}
	return true
}

// decodeStrict decodes b into v as decodeBytes does, but field names exactly as sh
// names them, each once, and integers within sh's bounds; every refusal in the API's
// terms.
func decodeStrict(b []byte, v any, sh *shape) error {
	if !json.Valid(b) {
		if err := invalidJSON(b); err != nil {
			return err
		}
		return decodeBytes(b, v) // the words of the admin routes: where the JSON breaks
	}
	if _, werr := sh.walk(b, 0); werr != nil {
		return werr.err()
	}
	if err := duplicateName(b); err != nil {
		return err
	}
	return decodeBytes(b, v)
}

var byteOrderMark = []byte("\xef\xbb\xbf")

// invalidJSON says what is wrong with b, which is not valid JSON, when encoding/json's
// words would not say it plainly: a byte order mark before it, or a number with a
// leading zero. Otherwise it returns nil, and bodyError words it.
func invalidJSON(b []byte) error {
	if bytes.HasPrefix(b, byteOrderMark) {
		return bodyProblem("starts with a byte order mark (U+FEFF): send plain UTF-8 JSON, without it")
	}
	var syn *json.SyntaxError
	if !errors.As(json.Unmarshal(b, new(any)), &syn) {
		return nil
	}
	// The digit after a lone 0 (01, -01): the scanner ends the number at the 0.
	at := int(syn.Offset) - 1
	if at < 1 || at >= len(b) || b[at] < '0' || b[at] > '9' || b[at-1] != '0' {
		return nil
	}
	start := at - 1
	if start > 0 && b[start-1] == '-' {
		start--
	}
	if start > 0 && !bytes.ContainsRune([]byte(" \t\r\n:,["), rune(b[start-1])) {
		return nil // not where a value starts (a 0 in 10 or 1.0 is no leading zero)
	}
	end := at
	for end < len(b) && b[end] >= '0' && b[end] <= '9' {
		end++
	}
	return bodyProblem(fmt.Sprintf("is not valid JSON: the number %s starts with a zero, at %s; write integers without leading zeros",
		b[start:end], position(b, int64(start))))
}

// walkError is what walk found wrong, at the path of segments from the value up
// (built only on the way out: a body walk finds nothing wrong allocates nothing).
type walkError struct {
	up      []segment
	unknown bool   // the last segment is not a field of its object
	msg     string // else what the value must be
}

// segment is a step of a path: an object's key, or an array's index.
type segment struct {
	key   string
	index int // -1 for a key
}

func (e *walkError) at(s segment) *walkError {
	e.up = append(e.up, s)
	return e
}

// err is the problem, the path as decodeBytes writes it ("checks[1].cost").
func (e *walkError) err() error {
	var sb strings.Builder
	for i := len(e.up) - 1; i >= 0; i-- {
		switch s := e.up[i]; {
		case s.index >= 0:
			fmt.Fprintf(&sb, "[%d]", s.index)
		case sb.Len() > 0:
			sb.WriteString("." + s.key)
		default:
			sb.WriteString(s.key)
		}
	}
	path := sb.String()
	if e.unknown {
		return derrors.E(derrors.Invalid, fmt.Sprintf("unknown field %q", path), nil,
			FieldError{Field: path, Message: "is not a field of this request"})
	}
	return derrors.Field(path, e.msg)
}

// walk checks the value at b[i] (b is valid JSON) against sh, and returns the index
// after it, or the first thing wrong with it.
func (sh *shape) walk(b []byte, i int) (int, *walkError) {
	i = skipSpaceB(b, i)
	switch {
	case b[i] == '{' && (sh.kind == objectOf || sh.kind == mapOf || sh.kind == integerOrMap):
		i = skipSpaceB(b, i+1)
		if b[i] == '}' {
			return i + 1, nil
		}
		for {
			raw, j := keyAt(b, i)
			elem := sh.elem
			if sh.kind == objectOf {
				if plainKey(raw) {
					elem = sh.fields[string(raw)] // no copy to look it up
				} else {
					elem = sh.fields[keyName(raw)]
				}
			}
			if elem == nil {
				return 0, &walkError{up: []segment{{key: keyName(raw), index: -1}}, unknown: true}
			}
			j, werr := elem.walk(b, skipSpaceB(b, j)+1) // after the colon
			if werr != nil {
				return 0, werr.at(segment{key: keyName(raw), index: -1})
			}
			j = skipSpaceB(b, j)
			if b[j] == '}' {
				return j + 1, nil
			}
			i = skipSpaceB(b, j+1) // after the comma
		}
	case b[i] == '[' && sh.kind == arrayOf:
		i = skipSpaceB(b, i+1)
		if b[i] == ']' {
			return i + 1, nil
		}
		for n := 0; ; n++ {
			j, werr := sh.elem.walk(b, i)
			if werr != nil {
				return 0, werr.at(segment{index: n})
			}
			j = skipSpaceB(b, j)
			if b[j] == ']' {
				return j + 1, nil
			}
			i = skipSpaceB(b, j+1)
		}
	case sh.kind == integer, sh.kind == integerOrMap && (b[i] == '-' || b[i] >= '0' && b[i] <= '9' || b[i] == 'n'):
		end := skipValue(b, i)
		if lit := b[i:end]; string(lit) != "null" && !isInt64(lit) {
			// What encoding/json admits into an int64: digits, no fraction or
			// exponent, in range. The bounds themselves are the service's to check.
			return 0, &walkError{msg: fmt.Sprintf("must be an integer from %d to %d", sh.lo, sh.hi)}
		}
		return end, nil
	}
	return skipValue(b, i), nil // another kind than sh's: encoding/json words it
}

// isInt64 reports whether the JSON number lit is an integer encoding/json puts in an int64.
func isInt64(lit []byte) bool {
	digits := lit
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 19 {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	if len(digits) < 19 {
		return true
	}
	const maxDigits, minDigits = "9223372036854775807", "9223372036854775808"
	if lit[0] == '-' {
		return string(digits) <= minDigits
	}
	return string(digits) <= maxDigits
}

// keyAt returns the key at b[i] as it is written, between its quotes, and the index
// after it.
func keyAt(b []byte, i int) ([]byte, int) {
	end := skipValue(b, i)
	return b[i+1 : end-1], end
}

// plainKey reports whether raw reads as it is written: no escape, only ASCII.
func plainKey(raw []byte) bool {
	for _, c := range raw {
		if c == '\\' || c >= 0x80 {
			return false
		}
	}
	return true
}

// keyName is the key raw as encoding/json decodes it (escapes resolved, invalid UTF-8
// as U+FFFD): the caller's own words.
func keyName(raw []byte) string {
	if plainKey(raw) {
		return string(raw)
	}
	var s string
	q := make([]byte, 0, len(raw)+2)
	q = append(append(append(q, '"'), raw...), '"')
	_ = json.Unmarshal(q, &s)
	return s
}

func skipSpaceB(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipValue returns the index after the JSON value at b[i] (b is valid JSON).
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		for j := i + 1; ; j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1
			}
		}
	case '{', '[':
		depth := 0
		for j := i; ; j++ {
			switch b[j] {
			case '"':
				j = skipValue(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
	}
	j := i
	for j < len(b) && !bytes.ContainsRune([]byte(" \t\r\n,]}"), rune(b[j])) {
		j++
	}
	return j
}
