package httpapi

import (
	"github.com/quotaplane/quotaplane/internal/httpapi/api"
	"github.com/quotaplane/quotaplane/internal/tenants"
)

// Named converters between the generated wire types and the domain types.

func toLimits(in []api.Limit) []tenants.Limit {
	out := make([]tenants.Limit, len(in))
	for i, l := range in {
		out[i] = tenants.Limit{Metric: l.Metric, Window: tenants.Window(l.Window), Limit: l.Limit}
	}
	return out
}

func toLimitsPtr(in *api.Limits) *[]tenants.Limit {
	if in == nil {
		return nil
	}
	ls := toLimits(*in)
	return &ls
}

func optLimits(in *api.Limits) []tenants.Limit {
	if in == nil {
		return nil
	}
	return toLimits(*in)
}

func fromLimits(in []tenants.Limit) []api.Limit {
	out := make([]api.Limit, len(in))
	for i, l := range in {
		out[i] = api.Limit{Metric: l.Metric, Window: api.Window(l.Window), Limit: l.Limit}
	}
	return out
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
