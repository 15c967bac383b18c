package vocab_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

func TestPeriodAt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		at     string
		anchor int
		want   vocab.Period
	}{
		{name: "calendar month", at: "2026-11-21T10:00:00Z", anchor: 1, want: period("2026-11", "2026-11-01", "2026-12-01")},
		{name: "anchor 0 means 1", at: "2026-11-01T00:00:00Z", anchor: 0, want: period("2026-11", "2026-11-01", "2026-12-01")},
		{name: "before the anchor day", at: "2026-11-14T23:59:59Z", anchor: 15, want: period("2026-10", "2026-10-15", "2026-11-15")},
		{name: "on the anchor day", at: "2026-11-15T00:00:00Z", anchor: 15, want: period("2026-11", "2026-11-15", "2026-12-15")},
		{name: "across the year", at: "2027-01-10T00:00:00Z", anchor: 28, want: period("2026-12", "2026-12-28", "2027-01-28")},
		{name: "other time zones are UTC", at: "2026-12-01T00:30:00+01:00", anchor: 1, want: period("2026-11", "2026-11-01", "2026-12-01")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, err := time.Parse(time.RFC3339, tt.at)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, vocab.PeriodAt(at, tt.anchor)); diff != "" {
				t.Errorf("PeriodAt(%s, %d) (-want +got):\n%s", tt.at, tt.anchor, diff)
			}
		})
	}
}

func period(id, start, end string) vocab.Period {
	s, _ := time.Parse(time.DateOnly, start)
	e, _ := time.Parse(time.DateOnly, end)
	return vocab.Period{ID: id, Start: s, End: e}
}
