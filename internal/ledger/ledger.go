package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// ErrNoCounters is returned by a CounterSource that cannot reach an org's Redis;
// wrapped with context, test it with errors.Is.
var ErrNoCounters = derrors.New(derrors.Unavailable, "live counters unavailable")

// Counters reads the live month counters of orgs on one Redis. *quota.Engine
// satisfies it. Its methods return errors wrapping quota.ErrUnavailable when Redis
// fails and quota.ErrInvalid for a bad org or period.
type Counters interface {
	// MonthUsage reads every counter of org in period.
	MonthUsage(ctx context.Context, org, period string) (map[quota.Counter]int64, error)
	// WouldBlockVersion reads the epoch and version of org's would-block record of
	// period ("" and 0 when there is none).
	WouldBlockVersion(ctx context.Context, org, period string) (string, int64, error)
	// WouldBlock reads org's would-block record of period.
	WouldBlock(ctx context.Context, org, period string) (quota.WouldBlockRecord, error)
	// Drain takes the counters of org changed in period since the last drain and
	// the reservations of period changed since then, in one snapshot; Undrain marks
	// the reservations changed again when they could not be persisted.
	Drain(ctx context.Context, org, period string) (quota.Drained, error)
	Undrain(ctx context.Context, org string, recs []quota.ReservationRecord) error
	// HeldUnits reads the units of org in period held by open reservations, which
	// the counters include.
	HeldUnits(ctx context.Context, org, period string) (map[quota.Counter]int64, error)
}

// CounterSource finds the Redis that holds an org's live counters. CountersFor
// returns an error wrapping ErrNoCounters when that Redis cannot be used (a bad URL).
type CounterSource interface {
	CountersFor(org string, r vocab.Route) (Counters, error)
}

// CounterSourceFunc adapts a function to a CounterSource.
type CounterSourceFunc func(org string, r vocab.Route) (Counters, error)

// CountersFor calls f.
func (f CounterSourceFunc) CountersFor(org string, r vocab.Route) (Counters, error) { return f(org, r) }

// DirtyIndex is one Redis's dirty-org index: the orgs that changed since the last pop.
// *quota.Engine satisfies it. Both return errors wrapping quota.ErrUnavailable when
// Redis fails.
type DirtyIndex interface {
	// PopDirtyOrgs takes the orgs that changed, atomically: one that changes after
	// is returned by the next pop. Each is recorded in flight until DoneInFlight;
	// with recoverAfter >= 0 the orgs recorded for at least that long come too, to
	// be read whole (quota.Engine.PopDirtyOrgs).
	PopDirtyOrgs(ctx context.Context, recoverAfter time.Duration) ([]quota.DirtyOrg, error)
	// DoneInFlight removes orgs whose drained counters are written from the record.
	DoneInFlight(ctx context.Context, orgs []quota.DirtyOrg) error
	// MarkDirtyOrgs puts orgs back for the next pop.
	MarkDirtyOrgs(ctx context.Context, orgs ...string) error
}

// IndexedSource is a CounterSource whose shared Redis keep dirty-org indexes: the
// flusher then visits only the orgs popped from them (and those with a Redis of
// their own), not every org. DirtyIndexes returns every index of a shared Redis
// (not the orgs' dedicated ones), those it could open when it also returns an error.
type IndexedSource interface {
	CounterSource
	DirtyIndexes() ([]DirtyIndex, error)
}

// EngineCounters reads an org's live counters where router counts its checks: the
// org's dedicated Redis, its plan's pool, or the default one. A dedicated Redis that
// fails is polled with a growing pause (quota.Engines.PollEngine): meanwhile
// CountersFor returns an error wrapping quota.ErrAway, which the flusher skips
// quietly. Its DirtyIndexes are the default Redis's and every pool's.
func EngineCounters(router *quota.Engines) IndexedSource { return engineCounters{router} }

type engineCounters struct{ router *quota.Engines }

func (s engineCounters) CountersFor(org string, r vocab.Route) (Counters, error) {
	eng, done, err := s.router.PollEngine(r)
	if err != nil {
		return nil, fmt.Errorf("%w: org %s: %w", ErrNoCounters, org, err)
	}
	return polled{Engine: eng, done: done}, nil
}

func (s engineCounters) DirtyIndexes() ([]DirtyIndex, error) {
	engs, err := s.router.PoolEngines()
	out := make([]DirtyIndex, len(engs))
	for i, e := range engs {
		out[i] = e
	}
	return out, err
}

// polled is an engine's counters with the report of how a poll went (PollDone).
type polled struct {
	*quota.Engine
	done func(error) error
}

// PollDone reports the outcome of a flush of one org on these counters, and returns
// the error to report (one that started a backoff says so).
func (p polled) PollDone(err error) error { return p.done(err) }

// counterRow is a counter with its value in flat, sortable form.
type counterRow struct {
	metric, level, team, user string
	units                     int64
}

func rowsOf(m map[quota.Counter]int64) []counterRow {
	out := make([]counterRow, 0, len(m))
	for c, v := range m {
		out = append(out, counterRow{metric: c.Metric, level: string(c.Level), team: c.Team, user: c.User, units: v})
	}
	// One order everywhere, so concurrent upserts lock rows in the same order.
	slices.SortFunc(out, func(a, b counterRow) int {
		return cmp.Or(cmp.Compare(a.metric, b.metric), cmp.Compare(a.level, b.level), cmp.Compare(a.team, b.team),
			cmp.Compare(a.user, b.user))
	})
	return out
}

func (r counterRow) counter() quota.Counter {
	return quota.Counter{Metric: r.metric, Level: vocab.Level(r.level), Team: r.team, User: r.user}
}
