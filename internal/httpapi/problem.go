package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
)

// FieldError names one invalid field of a request and what is wrong with it.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// problem is an RFC 9457 problem document.
type problem struct {
	Type   string       `json:"type"`
	Title  string       `json:"title"`
	Status int          `json:"status"`
	Detail string       `json:"detail,omitempty"`
	Errors []FieldError `json:"errors,omitempty"`
}

// problemTypeBase prefixes the type URI of every problem document; the suffix is
// the status text in kebab case ("unprocessable-entity").
const problemTypeBase = "https://quotaplane.dev/problems/"

// writeProblem writes an application/problem+json response. detail must be safe to
// show to the caller: never pass an internal error's text for a 5xx.
func writeProblem(w http.ResponseWriter, status int, detail string, fieldErrs ...FieldError) {
	title := http.StatusText(status)
	p := problem{
		Type:   problemTypeBase + strings.ReplaceAll(strings.ToLower(title), " ", "-"),
		Title:  title,
		Status: status,
		Detail: detail,
		Errors: fieldErrs,
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(p)
}
