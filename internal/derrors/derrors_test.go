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
