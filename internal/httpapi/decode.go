package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/jsonnames"
)

// errTooLarge answers a body over MaxBodyBytes.
var errTooLarge = derrors.E(derrors.TooLarge, fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes), nil)

// decode reads a JSON body into v, rejecting unknown fields and trailing data. It
// writes the problem and returns false when the body is unusable.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, ok := readBody(w, r)
	if !ok {
		return false
	}
	if err := decodeBytes(b, v); err != nil {
		refuse(w, r, err)
		return false
	}
	return true
}

// readBody reads the whole body (capped by the route group), or answers why it cannot.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(r.Body)
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		err = errTooLarge
	} else if err != nil {
		err = derrors.E(derrors.Invalid, "request body could not be read", err)
	}
	if err != nil {
		refuse(w, r, err)
		return nil, false
	}
	return b, true
}

// sentNull reports whether the JSON object b sets field to null: a PATCH's "remove
// it", which the generated types cannot tell from leaving the field out.
func sentNull(b []byte, field string) bool {
	var fields map[string]json.RawMessage
	if json.Unmarshal(b, &fields) != nil {
		return false
	}
	v, ok := fields[field]
	return ok && string(bytes.TrimSpace(v)) == "null"
}

// decodeBytes decodes b into v as decode does, and says what is wrong in the API's
// terms: the field and what it must be, or where the JSON breaks; never Go's words.
func decodeBytes(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Only white space may follow. (dec.More() is no test of that: it is false
		// before a stray ']' or '}', and {"org":"a"}] was accepted.)
		end := dec.InputOffset()
		if _, terr := dec.Token(); terr != io.EOF {
			next := end + int64(len(b[end:])-len(bytes.TrimLeft(b[end:], " \t\r\n")))
			return bodyProblem(fmt.Sprintf("has more after the JSON object, at %s", position(b, next)))
		}
		return nulError(b)
	}
	return bodyError(b, err)
}

// nulError refuses text with the NUL character, which Postgres cannot store: a name
// or reason with one failed deep in a write (a 500; an adjustment moved its counter
// and then failed on its audit row). JSON can only carry it escaped, so a body
// without "\u0000" is passed at once; one with it is walked for the fields that hold
// it (a "\\u0000" that is a backslash and "u0000" is no NUL and is let through).
func nulError(b []byte) error {
	if !bytes.Contains(b, []byte(`\u0000`)) {
		return nil
	}
	var doc any
	if json.Unmarshal(b, &doc) != nil {
		return nil
	}
	var fields []FieldError
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case string:
			if strings.ContainsRune(x, 0) {
				fields = append(fields, FieldError{Field: path, Message: "must not contain the NUL character (\\u0000)"})
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				p := k
				if path != "" {
					p = path + "." + k
				}
				if strings.ContainsRune(k, 0) {
					fields = append(fields, FieldError{Field: strings.ReplaceAll(p, "\x00", `\u0000`), Message: "is a field name with the NUL character (\\u0000)"})
				}
				walk(p, x[k])
			}
		}
	}
	walk("", doc)
	if len(fields) == 0 {
		return nil
	}
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.Field + ": " + f.Message
	}
	return derrors.E(derrors.Invalid, strings.Join(names, "; "), nil, fields...)
}

// duplicateName refuses the valid JSON b when an object of it names a member twice,
// naming the member by its path: encoding/json would keep the last without a word.
// Each route family asks once, where it first holds the body: the validator (admin
// routes) and decodeStrict (checks and reservations, whose hand-written fast path
// declines a repeated field and so ends there).
func duplicateName(b []byte) error {
	path, found := jsonnames.Duplicate(b)
	if !found {
		return nil
	}
	return derrors.Field(path, "field named twice (send each field once)")
}

// bodyProblem is a 400 about the body as a whole.
func bodyProblem(msg string) error {
	return derrors.E(derrors.Invalid, "request body "+msg, nil, FieldError{Field: "body", Message: msg})
}

// bodyError translates an error of encoding/json about body b.
func bodyError(b []byte, err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return bodyProblem("is empty: send a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return bodyProblem(fmt.Sprintf("is not valid JSON: it ends at %s before the JSON is complete", position(b, int64(len(b)))))
	case errors.As(err, &syn):
		msg := strings.TrimPrefix(syn.Error(), "json: ")
		return bodyProblem(fmt.Sprintf("is not valid JSON: %s at %s", msg, position(b, syn.Offset-1)))
	case errors.As(err, &typ):
		field := pathAt(b, typ.Offset, "")
		if field == "" {
			return bodyProblem("must be a JSON object, not " + jsonKind(typ.Value))
		}
		return derrors.Field(field, "must be "+typeWords(typ.Type))
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if n, uerr := strconv.Unquote(name); uerr == nil {
			field := pathAt(b, -1, n)
			if field == "" {
				field = n
			}
			return derrors.E(derrors.Invalid, fmt.Sprintf("unknown field %q", field), nil,
				FieldError{Field: field, Message: "is not a field of this request"})
		}
	}
	return bodyProblem("is not valid")
}

// jsonKind names the JSON type encoding/json reports ("number 12", "array").
func jsonKind(v string) string {
	kind, _, _ := strings.Cut(v, " ")
	switch kind {
	case "array", "object":
		return "an " + kind
	case "number", "string":
		return "a " + kind
	case "bool":
		return "true or false"
	}
	return kind
}

// typeWords says what a value of type t is in JSON.
func typeWords(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return "of another type"
}

// position describes the byte of b at index i as "line 2, column 7" (both from 1).
func position(b []byte, i int64) string {
	i = min(max(i, 0), int64(len(b)))
	line := 1 + bytes.Count(b[:i], []byte{'\n'})
	col := i - int64(bytes.LastIndexByte(b[:i], '\n'))
	return fmt.Sprintf("line %d, column %d", line, col)
}

// pathAt returns the path ("checks[3].cost") of the value of b that encoding/json
// was reading at offset off, or, when key is not "", of the first member named key.
// It returns "" for the top-level value or when b does not parse that far.
func pathAt(b []byte, off int64, key string) string {
	type frame struct {
		obj   bool
		key   string
		index int
		isKey bool // the next token of this object is a key
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	var stack []frame
	path := func() string {
		var sb strings.Builder
		for _, f := range stack {
			if f.obj {
				if sb.Len() > 0 {
					sb.WriteByte('.')
				}
				sb.WriteString(f.key)
			} else {
				fmt.Fprintf(&sb, "[%d]", f.index)
			}
		}
		return sb.String()
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		if n := len(stack); n > 0 {
			top := &stack[n-1]
			if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
				stack = stack[:n-1]
				if n > 1 && stack[n-2].obj {
					stack[n-2].isKey = true
				}
				continue
			}
			if top.obj && top.isKey {
				top.key, top.isKey = tok.(string), false
				if key != "" && top.key == key {
					return path()
				}
				continue
			}
			if !top.obj {
				top.index++
			}
		}
		// tok starts a value at path().
		if key == "" && off >= 0 && dec.InputOffset() >= off {
			return path()
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{obj: true, isKey: true})
		case json.Delim('['):
			stack = append(stack, frame{index: -1})
		default:
			if n := len(stack); n > 0 && stack[n-1].obj {
				stack[n-1].isKey = true
			}
		}
	}
}
