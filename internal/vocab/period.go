package vocab

import "time"

// Period is one billing period of an org: [Start, End) in UTC.
type Period struct {
	// ID is the year and month in which the period starts, "2026-11"; it names the
	// period in keys, in the usage API (?period=YYYY-MM) and in billing exports.
	ID    string
	Start time.Time
	End   time.Time
}

// PeriodAt returns the billing period containing t for an org whose periods start on
// anchorDay (1..28; anything else means 1, the calendar month UTC).
func PeriodAt(t time.Time, anchorDay int) Period {
	if anchorDay < 1 || anchorDay > 28 {
		anchorDay = 1
	}
	t = t.UTC()
	y, m, d := t.Date()
	if d < anchorDay {
		m-- // time.Date normalises month 0 to December of the previous year
	}
	start := time.Date(y, m, anchorDay, 0, 0, 0, 0, time.UTC)
	return Period{ID: start.Format("2006-01"), Start: start, End: start.AddDate(0, 1, 0)}
}
