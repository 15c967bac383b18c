package httpapi

import (
	"errors"
	"net/http"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
)

// Errors are answered in one place: every refusal is an error of a derrors kind, and
// internal/platform/problem maps the kind to its status and problem document. Nothing
// in this package chooses an error status.

// FieldError names one invalid field of a request and what is wrong with it.
type FieldError = derrors.FieldError

// fail answers err, logging it when it is a 5xx.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	problem.Write(w, r, s.log, err)
}

// refuse answers a refusal found before any dependency was asked (never a 5xx).
func refuse(w http.ResponseWriter, r *http.Request, err error) { problem.Write(w, r, nil, err) }

// invalid is a 400 listing the fields at fault.
func invalid(detail string, fields ...FieldError) error {
	return derrors.E(derrors.Invalid, detail, nil, fields...)
}

// paramError answers the generated router's errors of path and query parameters
// (the validator catches most of them first) naming the parameter, never in Go's words.
func paramError(w http.ResponseWriter, r *http.Request, err error) {
	name := ""
	var (
		fe *api.InvalidParamFormatError
		re *api.RequiredParamError
		te *api.TooManyValuesForParamError
		ue *api.UnmarshalingParamError
	)
	switch {
	case errors.As(err, &fe):
		name = fe.ParamName
	case errors.As(err, &re):
		refuse(w, r, derrors.Field(re.ParamName, "is required"))
		return
	case errors.As(err, &te):
		name = te.ParamName
	case errors.As(err, &ue):
		name = ue.ParamName
	}
	if name == "" {
		refuse(w, r, invalid("a parameter of the request is malformed"))
		return
	}
	refuse(w, r, derrors.Field(name, "is malformed"))
}

// itemProblem is the problem of one refused check of a batch.
func itemProblem(err error) api.Problem {
	d := problem.From(err)
	p := api.Problem{Type: d.Type, Title: d.Title, Status: d.Status}
	if d.Detail != "" {
		p.Detail = &d.Detail
	}
	for _, f := range d.Errors {
		p.Errors = append(p.Errors, api.FieldError{Field: f.Field, Message: f.Message})
	}
	return p
}
