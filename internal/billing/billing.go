package billing

import (
	"errors"
	"fmt"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Errors of the package; wrapped with context, test them with errors.Is.
var (
	// ErrInvalid marks a bad org id, period or format.
	ErrInvalid = derrors.New(derrors.Invalid, "invalid billing request")
	// ErrNotDue is returned by Closer.Close for a period that has not ended (plus the
	// grace) yet.
	ErrNotDue = errors.New("period has not ended yet")
	// ErrNoLiveCounters is returned by AdjustUsage when the server has no live counters
	// to adjust (no quota engine configured, or the org's Redis cannot be used).
	ErrNoLiveCounters = derrors.New(derrors.Unavailable, "the quota store is not configured on this server")
)

// badPeriod and badFormat refuse a parameter of a billing request, naming it; both
// match ErrInvalid.
func badPeriod(id string) error {
	return derrors.E(derrors.Invalid, fmt.Sprintf("period: %q is not YYYY-MM", id), ErrInvalid,
		derrors.FieldError{Field: "period", Message: "must be a month as YYYY-MM"})
}

func badFormat(f Format) error {
	return derrors.E(derrors.Invalid, fmt.Sprintf("format: %q is not csv or json", f), ErrInvalid,
		derrors.FieldError{Field: "format", Message: "must be csv or json"})
}

// ParsePeriod checks a period id (YYYY-MM).
func ParsePeriod(id string) error {
	if _, err := time.Parse("2006-01", id); err != nil || len(id) != 7 {
		return badPeriod(id)
	}
	return nil
}

// notBegun refuses a period after the current one, naming both: nothing can have been
// used in it, and a 200 with empty usage would read as if the org had used nothing.
func notBegun(per, cur vocab.Period) error {
	return derrors.E(derrors.Invalid, fmt.Sprintf("period: %s has not begun (the current period is %s)", per.ID, cur.ID), ErrInvalid,
		derrors.FieldError{Field: "period", Message: "must be the current period (" + cur.ID + ") or an earlier one"})
}

// periodAsked is the period named id of an org with anchorDay ("" for cur, the current
// one); ErrInvalid for a malformed id or a period that has not begun.
func periodAsked(id string, anchorDay int, cur vocab.Period) (vocab.Period, error) {
	if id == "" {
		return cur, nil
	}
	per, err := PeriodOf(id, anchorDay)
	if err != nil {
		return vocab.Period{}, err
	}
	if per.Start.After(cur.Start) {
		return vocab.Period{}, notBegun(per, cur)
	}
	return per, nil
}

// PeriodOf returns the period with id for an org with the given anchor day.
func PeriodOf(id string, anchorDay int) (vocab.Period, error) {
	t, err := time.Parse("2006-01", id)
	if err != nil || len(id) != 7 {
		return vocab.Period{}, badPeriod(id)
	}
	if anchorDay < 1 || anchorDay > 28 {
		anchorDay = 1
	}
	return vocab.PeriodAt(t.AddDate(0, 0, anchorDay-1), anchorDay), nil
}

// counterRow is a counter with its value as a row of period_usage or usage_counters.
type counterRow struct {
	metric, level, team, user string
	units                     int64
}

func (r counterRow) counter() quota.Counter {
	return quota.Counter{Metric: r.metric, Level: vocab.Level(r.level), Team: r.team, User: r.user}
}
