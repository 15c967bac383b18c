package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/mail"
	"sort"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
)

// maxValidatedBody caps the body the validator reads into memory. It is a backstop:
// the server may set a smaller limit with http.MaxBytesReader before the validator,
// and either limit answers 413.
const maxValidatedBody = 1 << 20

// requestValidator checks requests against the embedded OpenAPI spec. The spec is
// parsed and the router built once; both are only read afterwards, so one
// validator serves concurrent requests.
type requestValidator struct {
	router  routers.Router
	options *openapi3filter.Options
}

// newRequestValidator returns a middleware that validates every request whose
// route the spec knows (path, query parameters and JSON body) and answers 400
// with one FieldError per problem. Requests for routes the spec does not know pass
// through untouched, so the router answers 404 or 405. Authentication is not
// checked here.
func newRequestValidator() (func(http.Handler) http.Handler, error) {
	doc, err := api.GetSwagger()
	if err != nil {
		return nil, fmt.Errorf("load embedded OpenAPI spec: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("embedded OpenAPI spec is invalid: %w", err)
	}
	// Match on the path alone, whatever host and port the server listens on.
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("build OpenAPI router: %w", err)
	}
	v := &requestValidator{
		router: router,
		options: &openapi3filter.Options{
			MultiError: true,
			// Authentication and scopes are checked by the auth middleware.
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			// Leave the body and query as sent: handlers apply defaults, and a PATCH
			// must not grow fields the caller did not send.
			SkipSettingDefaults: true,
			SchemaValidationOptions: []openapi3.SchemaValidationOption{
				openapi3.WithStringFormatValidator("email", openapi3.NewCallbackValidator(validateEmail)),
			},
		},
	}
	return v.middleware, nil
}

func validateEmail(s string) error {
	a, err := mail.ParseAddress(s)
	if err != nil || a.Address != s {
		return errors.New("not an email address")
	}
	return nil
}

func (v *requestValidator) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route, pathParams, err := v.router.FindRoute(r)
		if err != nil {
			// Unknown path or method: the router's 404/405.
			next.ServeHTTP(w, r)
			return
		}
		if err := v.validate(w, r, route, pathParams); err != nil {
			refuse(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// validate checks r and returns nil when it is valid, or the error to answer. It
// leaves r.Body readable from the start.
func (v *requestValidator) validate(w http.ResponseWriter, r *http.Request, route *routers.Route, pathParams map[string]string) error {
	if route.Operation.RequestBody != nil {
		if ct := r.Header.Get("Content-Type"); !jsonBody(ct) {
			return errUnsupportedMediaType(ct)
		}
	}
	var body []byte
	if r.Body != nil && r.Body != http.NoBody {
		var err error
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxValidatedBody))
		_ = r.Body.Close()
		if err != nil {
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				return errTooLarge
			}
			return invalid("request body could not be read")
		}
		setBody(r, body)
	}

	if len(body) > 0 && route.Operation.RequestBody != nil {
		// jsonBody admitted the type above: whatever it is (none, +json, curl's form
		// type), the body is JSON, which is what the spec's matcher must be told.
		r.Header.Set("Content-Type", "application/json")
		if !json.Valid(body) {
			if err := invalidJSON(body); err != nil { // a byte order mark, a leading zero
				return err
			}
			return bodyError(body, json.Unmarshal(body, new(any)))
		}
		if err := duplicateName(body); err != nil {
			return err
		}
	}

	err := openapi3filter.ValidateRequest(r.Context(), &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: pathParams,
		Route:      route,
		Options:    v.options,
	})
	if body != nil {
		// openapi3filter put back a reader of its own; start the handler afresh.
		setBody(r, body)
	}
	if err == nil {
		return nil
	}
	return problemFromValidation(err)
}

// setBody makes body the request's body, readable (again) from its start.
func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// problemFromValidation turns the error of openapi3filter.ValidateRequest into a
// 400 problem with one FieldError per schema problem.
func problemFromValidation(err error) error {
	var fieldErrs []FieldError
	var details []string
	for _, e := range flatten(err) {
		var re *openapi3filter.RequestError
		if !errors.As(e, &re) {
			details = append(details, "the request does not match the API contract")
			continue
		}
		switch {
		case re.Parameter != nil:
			fieldErrs = append(fieldErrs, parameterErrors(re)...)
		case re.RequestBody != nil:
			fes, detail := bodyErrors(re)
			fieldErrs = append(fieldErrs, fes...)
			if detail != "" {
				details = append(details, detail)
			}
		default:
			details = append(details, "the request does not match the API contract")
		}
	}
	sort.SliceStable(fieldErrs, func(i, j int) bool { return fieldErrs[i].Field < fieldErrs[j].Field })
	for _, fe := range fieldErrs {
		details = append(details, fe.Field+": "+fe.Message)
	}
	if len(details) == 0 {
		details = append(details, "the request is invalid")
	}
	detail := strings.Join(details, "; ")
	if len(fieldErrs) == 0 {
		// Every 400 names what is at fault: here the body as a whole.
		fieldErrs = []FieldError{{Field: "body", Message: strings.TrimPrefix(detail, "request body ")}}
	}
	return invalid(detail, fieldErrs...)
}

// flatten lists the errors of a (possibly nested) openapi3.MultiError.
func flatten(err error) []error {
	me, ok := err.(openapi3.MultiError)
	if !ok {
		return []error{err}
	}
	var out []error
	for _, e := range me {
		if _, ok := e.(openapi3.MultiError); ok {
			out = append(out, flatten(e)...)
			continue
		}
		out = append(out, e)
	}
	return out
}

func parameterErrors(re *openapi3filter.RequestError) []FieldError {
	p := re.Parameter
	switch {
	case errors.Is(re.Err, openapi3filter.ErrInvalidRequired):
		return []FieldError{{Field: p.Name, Message: "is required"}}
	case errors.Is(re.Err, openapi3filter.ErrInvalidEmptyValue):
		return []FieldError{{Field: p.Name, Message: "must not be empty"}}
	}
	if pe := (*openapi3filter.ParseError)(nil); errors.As(re.Err, &pe) {
		msg := "is malformed"
		if p.Schema != nil && p.Schema.Value != nil {
			msg = typeMessage(p.Schema.Value)
		}
		return []FieldError{{Field: p.Name, Message: msg}}
	}
	if ses := schemaErrors(re.Err); len(ses) > 0 {
		out := make([]FieldError, 0, len(ses))
		for _, se := range ses {
			out = append(out, fieldError(p.Name, se))
		}
		return out
	}
	return []FieldError{{Field: p.Name, Message: "is invalid"}}
}

// bodyErrors returns the field errors of a request body error, or a detail when
// the problem is with the body as a whole.
func bodyErrors(re *openapi3filter.RequestError) ([]FieldError, string) {
	switch {
	case errors.Is(re.Err, openapi3filter.ErrInvalidRequired):
		return nil, "request body is required"
	case re.Err == nil && strings.HasPrefix(re.Reason, "header Content-Type"):
		return nil, "Content-Type must be application/json"
	}
	if pe := (*openapi3filter.ParseError)(nil); errors.As(re.Err, &pe) {
		return nil, "request body is not valid JSON"
	}
	ses := schemaErrors(re.Err)
	if len(ses) == 0 {
		return nil, "request body is invalid"
	}
	out := make([]FieldError, 0, len(ses))
	for _, se := range ses {
		out = append(out, fieldError("", se))
	}
	return out, ""
}

// schemaErrors collects the SchemaErrors within err. An allOf error (how the spec
// attaches a default or description to a $ref) is replaced by the errors of its
// subschemas, which say what is actually wrong.
func schemaErrors(err error) []*openapi3.SchemaError {
	var out []*openapi3.SchemaError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case openapi3.MultiError:
			for _, e := range e {
				walk(e)
			}
		case *openapi3.SchemaError:
			if e.SchemaField == "allOf" && e.Origin != nil {
				n := len(out)
				walk(e.Origin)
				if len(out) > n {
					return
				}
			}
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// fieldError describes se as a FieldError. base names the parameter the value
// came from ("" for the body); the JSON pointer of the value is appended to it
// as a path like "limits[0].window".
func fieldError(base string, se *openapi3.SchemaError) FieldError {
	segs := se.JSONPointer()
	msg := schemaMessage(se)
	if se.SchemaField == "properties" {
		// An unknown property is reported at its parent object; name the property.
		if name, ok := unsupportedProperty(se.Reason); ok {
			segs = append(segs[:len(segs):len(segs)], name)
			msg = fmt.Sprintf("unknown field %q", name)
		}
	}
	field := base
	for _, s := range segs {
		switch {
		case isIndex(s) && field != "":
			field += "[" + s + "]"
		case field == "":
			field = s
		default:
			field += "." + s
		}
	}
	if field == "" {
		field = "body"
	}
	return FieldError{Field: field, Message: msg}
}

// unsupportedProperty extracts the name from kin-openapi's
// `property "foo" is unsupported`.
func unsupportedProperty(reason string) (string, bool) {
	rest, ok := strings.CutPrefix(reason, "property ")
	if !ok {
		return "", false
	}
	quoted, ok := strings.CutSuffix(rest, " is unsupported")
	if !ok {
		return "", false
	}
	name, err := strconv.Unquote(quoted)
	return name, err == nil
}

func isIndex(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// schemaMessage says, for a person, what the value must be.
func schemaMessage(se *openapi3.SchemaError) string {
	s := se.Schema
	if s == nil {
		return "is invalid"
	}
	switch se.SchemaField {
	case "required":
		return "is required"
	case "properties":
		return "has an unknown field"
	case "enum":
		vals := make([]string, 0, len(s.Enum))
		for _, e := range s.Enum {
			vals = append(vals, fmt.Sprint(e))
		}
		return "must be one of " + strings.Join(vals, ", ")
	case "pattern":
		// A regular expression is no answer to a person: every pattern of the spec says
		// in words what it admits (x-invalid-message; TestNoPatternReachesAnError).
		if msg, ok := s.Extensions["x-invalid-message"].(string); ok {
			return msg
		}
		return "is not in the form this field takes"
	case "type":
		return typeMessage(s)
	case "nullable":
		return "must not be null"
	case "minLength":
		if s.MinLength == 1 {
			return "must not be empty"
		}
		return fmt.Sprintf("must be at least %d characters long", s.MinLength)
	case "maxLength":
		if s.MaxLength != nil {
			return fmt.Sprintf("must be at most %d characters long", *s.MaxLength)
		}
	case "minimum":
		if s.Min != nil {
			return "must be at least " + strconv.FormatFloat(*s.Min, 'f', -1, 64)
		}
	case "maximum":
		if s.Max != nil {
			return "must be at most " + strconv.FormatFloat(*s.Max, 'f', -1, 64)
		}
	case "minItems":
		return fmt.Sprintf("must have at least %d %s", s.MinItems, plural(s.MinItems, "item"))
	case "maxItems":
		if s.MaxItems != nil {
			return fmt.Sprintf("must have at most %d %s", *s.MaxItems, plural(*s.MaxItems, "item"))
		}
	case "uniqueItems":
		return "must not contain duplicates"
	case "format":
		switch s.Format {
		case "email":
			return "must be a valid email address"
		case "date-time":
			return "must be an RFC 3339 date-time"
		case "int32", "int64":
			return "must be a " + strings.TrimPrefix(s.Format, "int") + "-bit integer"
		}
		return "must be a valid " + s.Format
	}
	// A schema whose failures no rule above words (a oneOf, a maxProperties) may say
	// what its value must be itself: the spec's x-invalid-message (entitlements'
	// features do).
	if msg, ok := s.Extensions["x-invalid-message"].(string); ok {
		return msg
	}
	return "is invalid"
}

// typeMessage names the type a value of s must have.
func typeMessage(s *openapi3.Schema) string {
	if s.Type == nil || len(*s.Type) != 1 {
		return "has the wrong type"
	}
	switch t := (*s.Type)[0]; t {
	case openapi3.TypeInteger, openapi3.TypeArray, openapi3.TypeObject:
		return "must be an " + t
	case openapi3.TypeBoolean:
		return "must be true or false"
	default:
		return "must be a " + t
	}
}

func plural(n uint64, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
