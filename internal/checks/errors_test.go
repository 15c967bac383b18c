package checks

import (
	"errors"
	"fmt"
	"testing"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/problem"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// An engine error keeps the status of its kind; one the engine cannot place is a 503
// that names the quota store, never a 500 or the engine's text.
func TestEngineErrorKinds(t *testing.T) {
	conflict := derrors.New(derrors.Unprocessable, "idempotency key reused with a different request")
	for _, c := range []struct {
		err    error
		status int
	}{
		{fmt.Errorf("%w: cost -1", quota.ErrInvalid), 400},
		{fmt.Errorf("check acme: %w", quota.ErrOverloaded), 503},
		{fmt.Errorf("redis: %w", quota.ErrUnavailable), 503},
		{errors.New("something the engine did not foresee"), 503},
		{fmt.Errorf("check: %w", conflict), 422},
	} {
		d := problem.From(engineError(c.err))
		if d.Status != c.status {
			t.Errorf("%v answers %d, want %d", c.err, d.Status, c.status)
		}
		if d.Status == 503 && d.Detail == c.err.Error() {
			t.Errorf("%v: the engine's text was sent", c.err)
		}
	}
}
