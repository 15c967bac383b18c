package derrors_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

func TestKindOf(t *testing.T) {
	notFound := derrors.New(derrors.NotFound, "not found")
	for _, c := range []struct {
		err  error
		want derrors.Kind
	}{
		{fmt.Errorf("get team: %w", notFound), derrors.NotFound},
		{derrors.E(derrors.Unavailable, "down", errors.New("dial")), derrors.Unavailable},
		{derrors.E(derrors.Unavailable, "down", fmt.Errorf("query: %w", context.Canceled)), derrors.Canceled},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), derrors.Unavailable},
		{errors.New("boom"), derrors.Internal},
		{derrors.Field("cost", "must be an integer"), derrors.Invalid},
	} {
		if got := derrors.KindOf(c.err); got != c.want {
			t.Errorf("KindOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if !errors.Is(fmt.Errorf("a: %w", notFound), derrors.NotFound) {
		t.Error("a wrapped sentinel does not match its kind")
	}
	if fs := derrors.FieldsOf(fmt.Errorf("w: %w", derrors.Field("cost", "x"))); len(fs) != 1 || fs[0].Field != "cost" {
		t.Errorf("FieldsOf = %v", fs)
	}
}

func TestWrap(t *testing.T) {
	notFound := derrors.New(derrors.NotFound, "not found")
	overloaded := derrors.New(derrors.Overloaded, "300 in flight")
	cases := []struct {
		name         string
		err          error
		kind         derrors.Kind
		text, detail string // detail "" when Wrap builds none
	}{
		{"a sentinel", derrors.Wrap(notFound, "team %q of org %q", "eng", "acme"), derrors.NotFound,
			`team "eng" of org "acme": not found`, `team "eng" of org "acme" not found`},
		{"more context around it", fmt.Errorf("get team: %w", derrors.Wrap(notFound, "team %q", "eng")), derrors.NotFound,
			`get team: team "eng": not found`, `team "eng" not found`},
		{"a sentinel whose words are not told", derrors.Wrap(overloaded, "org %q", "acme"), derrors.Overloaded,
			`org "acme": 300 in flight`, ""},
		{"any other error", derrors.Wrap(errors.New("pq: boom"), "org %q", "acme"), derrors.Internal,
			`org "acme": pq: boom`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := derrors.KindOf(tc.err); got != tc.kind {
				t.Errorf("KindOf = %v, want %v", got, tc.kind)
			}
			if tc.err.Error() != tc.text {
				t.Errorf("text %q, want %q", tc.err.Error(), tc.text)
			}
			var de *derrors.Error
			detail := ""
			if errors.As(tc.err, &de) {
				detail = de.Detail
			}
			if detail != tc.detail {
				t.Errorf("detail %q, want %q", detail, tc.detail)
			}
		})
	}
	if w := derrors.Wrap(notFound, "x"); !errors.Is(w, notFound) || !errors.Is(w, derrors.NotFound) {
		t.Error("a wrapped sentinel does not match itself and its kind")
	}
	if derrors.Wrap(nil, "x") != nil {
		t.Error("Wrap(nil) is not nil")
	}
}
