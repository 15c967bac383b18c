package httpapi

import (
	"net/http"

	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Named converters between the generated wire types and the domain types.

func toLimits(in []api.Limit) []vocab.Limit {
	out := make([]vocab.Limit, len(in))
	for i, l := range in {
		out[i] = vocab.Limit{Metric: l.Metric, Window: l.Window, Limit: l.Limit}
		if l.Burst != nil {
			out[i].Burst = *l.Burst
		}
		if l.FairShare != nil {
			out[i].FairShare = *l.FairShare
		}
	}
	return out
}

func toLimitsPtr(in *api.Limits) *[]vocab.Limit {
	if in == nil {
		return nil
	}
	ls := toLimits(*in)
	return &ls
}

func optLimits(in *api.Limits) []vocab.Limit {
	if in == nil {
		return nil
	}
	return toLimits(*in)
}

func fromLimits(in []vocab.Limit) []api.Limit {
	out := make([]api.Limit, len(in))
	for i, l := range in {
		out[i] = api.Limit{Metric: l.Metric, Window: l.Window, Limit: l.Limit, Burst: burstOf(l.Burst)}
		if l.FairShare {
			out[i].FairShare = &fairShareTrue
		}
	}
	return out
}

// fairShareTrue is every shared limit's FairShare: it is only read.
var fairShareTrue = true

// burstOf is a bucket's burst as the API carries it: absent (nil) for any other limit.
func burstOf(b int64) *int64 {
	if b <= 0 {
		return nil
	}
	return &b
}

func mapSlice[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

func nextPtr(c string) *string {
	if c == "" {
		return nil
	}
	return &c
}

func page(limit *int, cursor *string) tenants.Page {
	p := tenants.Page{}
	if limit != nil {
		p.Limit = *limit
	}
	if cursor != nil {
		p.Cursor = *cursor
	}
	return p
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// nonZero is v's address, or nil for the zero value: an optional field of an answer.
func nonZero[T comparable](v T) *T {
	var zero T
	if v == zero {
		return nil
	}
	return &v
}

// The encode steps shared by the handlers that answer one object or none, and the
// decode -> call -> encode adapter of those whose call takes the decoded body as is
// (openmeter's httptransport, in three functions). A handler that does more between
// the steps (reads the raw body, checks fields, sets headers) writes them out.

// respond answers the result of a call: err as a problem document, else out(v) as
// JSON with status.
func respond[T, U any](s *Server, w http.ResponseWriter, r *http.Request, status int, out func(T) U, v T, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, status, out(v))
}

// handle decodes the request body into an In (or answers why it cannot), calls op
// with it, and answers as respond does.
func handle[In, T, U any](s *Server, w http.ResponseWriter, r *http.Request, status int, out func(T) U, op func(In) (T, error)) {
	var in In
	if !decode(w, r, &in) {
		return
	}
	v, err := op(in)
	respond(s, w, r, status, out, v, err)
}

// noContent answers a call that returns nothing: 204, or err as a problem document.
func (s *Server) noContent(w http.ResponseWriter, r *http.Request, err error) {
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
