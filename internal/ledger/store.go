package ledger

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Store is the usage ledger in Postgres: the rows of usage counters, their daily
// history, reservations and would-block records.
type Store struct {
	pool pgdb.DB // its errors match derrors.Unavailable when Postgres is down
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pgdb.DB{Pool: pool}} }

var _ quota.Hydrator = (*Store)(nil)

// upsertChunk bounds the rows of one upsert statement.
const upsertChunk = 5000

// PeriodLock serializes, per org and period, the flushes that write it and the close
// (and adjustments) that finalize it, so a flush is either before the close (the close
// sees it) or after it (its units above the closed ones become adjustments). It holds
// until tx ends.
func PeriodLock(ctx context.Context, tx pgx.Tx, org, period string) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('billing|' || $1 || '|' || $2, 0))`, org, period)
	return err
}

// InTx runs fn in a transaction, retrying serialization failures and deadlocks; its
// errors are translated by pgdb.Translate.
func (s *Store) InTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := pgx.BeginFunc(ctx, s.pool, fn)
		var pe *pgconn.PgError
		if err != nil && attempt < 5 && errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01") {
			continue
		}
		return pgdb.Translate(err)
	}
}

// Persist writes counters of org in period to the ledger, never lowering a stored
// value, and in the same transaction raises the org's daily history of the metrics
// written for the UTC day of day (see RecordDaily). If the period is already closed,
// units above what the close recorded are appended as adjustments (a late flush is
// reconciled, not lost). It returns how many stored values rose.
func (s *Store) Persist(ctx context.Context, org, period string, day time.Time, counters map[quota.Counter]int64) (int, error) {
	return s.PersistDrained(ctx, org, period, day, quota.Drained{Counters: counters})
}

// PersistDrained is Persist of a drain's counters and, in the same transaction, its
// reservations (a reservation's row only moves out of held, so an older write that
// comes late cannot undo a settlement).
func (s *Store) PersistDrained(ctx context.Context, org, period string, day time.Time, d quota.Drained) (int, error) {
	raised, err := s.PersistMany(ctx, []PeriodDrain{{Org: org, Period: period, Day: day, Drained: d}})
	if err != nil {
		return 0, fmt.Errorf("persist usage of %s %s: %w", org, period, err)
	}
	return raised[0], nil
}

// PeriodDrain is one org period's drain to persist, and the day of its daily history.
type PeriodDrain struct {
	Org, Period string
	Day         time.Time
	Drained     quota.Drained
}

// PersistMany is PersistDrained of many org periods in one transaction, with one
// statement for all their counters: the periods' locks (PeriodLock, taken in one
// order by every writer), their reservations, their counters raised, the daily
// history of those that rose and the adjustments of those already closed. It returns
// how many stored values rose, per item. One item that cannot be written fails all:
// the caller writes them one by one to find it.
func (s *Store) PersistMany(ctx context.Context, items []PeriodDrain) ([]int, error) {
	type pair struct{ org, period string }
	at := map[pair]int{} // item index by org period; a pair given twice is written once, its values merged
	var pairs []pair
	var rows []batchRow
	var drainedAt time.Time
	var withRecs []int
	for i, it := range items {
		p := pair{it.Org, it.Period}
		if _, ok := at[p]; ok {
			return nil, fmt.Errorf("persist usage: %s %s given twice", it.Org, it.Period)
		}
		at[p] = i
		if len(it.Drained.Counters) == 0 && len(it.Drained.Reservations) == 0 {
			continue
		}
		pairs = append(pairs, p)
		for _, r := range rowsOf(it.Drained.Counters) {
			rows = append(rows, batchRow{org: it.Org, period: it.Period, counterRow: r})
		}
		if a := it.Drained.At; !a.IsZero() && (drainedAt.IsZero() || a.Before(drainedAt)) {
			drainedAt = a // the earliest: every value was read at or after it
		}
		if len(it.Drained.Reservations) > 0 {
			withRecs = append(withRecs, i)
		}
	}
	raised := make([]int, len(items))
	if len(pairs) == 0 {
		return raised, nil
	}
	// One order everywhere, so concurrent writers take locks and rows in the same order.
	slices.SortFunc(pairs, func(a, b pair) int { return cmp.Or(cmp.Compare(a.org, b.org), cmp.Compare(a.period, b.period)) })
	slices.SortStableFunc(rows, func(a, b batchRow) int { return cmp.Or(cmp.Compare(a.org, b.org), cmp.Compare(a.period, b.period)) })
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		clear(raised)
		orgs, periods := make([]string, len(pairs)), make([]string, len(pairs))
		for i, p := range pairs {
			orgs[i], periods[i] = p.org, p.period
		}
		if _, err := tx.Exec(ctx, `SELECT count(pg_advisory_xact_lock(hashtextextended('billing|' || o || '|' || p, 0)))
			FROM unnest($1::text[], $2::text[]) AS x(o, p)`, orgs, periods); err != nil {
			return err
		}
		for _, i := range withRecs {
			if err := upsertReservations(ctx, tx, items[i].Org, items[i].Drained.Reservations); err != nil {
				return err
			}
		}
		rose := map[pair]bool{}
		for i := 0; i < len(rows); i += upsertChunk {
			up, err := upsertMany(ctx, tx, rows[i:min(i+upsertChunk, len(rows))], drainedAt)
			if err != nil {
				return err
			}
			for _, u := range up {
				p := pair{u[0], u[1]}
				raised[at[p]]++
				rose[p] = true
			}
		}
		if len(rose) == 0 {
			return nil
		}
		// The daily history of the metrics written in each period that rose, and the
		// adjustments of those already closed.
		var dOrgs, dPeriods, dMetrics []string
		var dDays []time.Time
		for _, r := range rows {
			p := pair{r.org, r.period}
			n := len(dOrgs)
			if !rose[p] || (n > 0 && dOrgs[n-1] == r.org && dPeriods[n-1] == r.period && dMetrics[n-1] == r.metric) {
				continue
			}
			d := items[at[p]].Day.UTC()
			dOrgs, dPeriods, dMetrics = append(dOrgs, r.org), append(dPeriods, r.period), append(dMetrics, r.metric)
			dDays = append(dDays, time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO usage_daily (org_id, period, metric, day, used)
			SELECT c.org_id, c.period, c.metric, x.d, c.units
			FROM unnest($1::text[], $2::text[], $3::text[], $4::date[]) AS x(o, p, m, d)
			JOIN usage_counters c ON c.org_id = x.o AND c.period = x.p AND c.metric = x.m AND c.level = 'org'
			ON CONFLICT (org_id, period, metric, day) DO UPDATE
			SET used = GREATEST(usage_daily.used, EXCLUDED.used), updated_at = now()
			WHERE usage_daily.used < EXCLUDED.used`, dOrgs, dPeriods, dMetrics, dDays); err != nil {
			return err
		}
		rOrgs, rPeriods := make([]string, 0, len(rose)), make([]string, 0, len(rose))
		for p := range rose {
			rOrgs, rPeriods = append(rOrgs, p.org), append(rPeriods, p.period)
		}
		closed, err := tx.Query(ctx, `SELECT x.o, x.p FROM unnest($1::text[], $2::text[]) AS x(o, p)
			WHERE EXISTS (SELECT 1 FROM billing_periods b WHERE b.org_id = x.o AND b.period = x.p)`, rOrgs, rPeriods)
		if err != nil {
			return err
		}
		var done []pair
		var p pair
		if _, err := pgx.ForEachRow(closed, []any{&p.org, &p.period}, func() error { done = append(done, p); return nil }); err != nil {
			return err
		}
		for _, p := range done {
			if err := reconcile(ctx, tx, p.org, p.period); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return raised, nil
}

// batchRow is a counter row of one org period.
type batchRow struct {
	org, period string
	counterRow
}

// upsertMany raises the ledger's rows to rows' values, as upsert does, and returns the
// org and period of each row that rose.
func upsertMany(ctx context.Context, tx pgx.Tx, rows []batchRow, drainedAt time.Time) ([][2]string, error) {
	n := len(rows)
	orgs, periods, metrics, levels, teams, users := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	units := make([]int64, n)
	for i, r := range rows {
		orgs[i], periods[i], metrics[i], levels[i], teams[i], users[i], units[i] = r.org, r.period, r.metric, r.level, r.team, r.user, r.units
	}
	res, err := tx.Query(ctx, `INSERT INTO usage_counters (org_id, period, metric, level, team_id, user_id, units)
		SELECT o, p, m, l, t, u, v FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::bigint[]) AS x(o, p, m, l, t, u, v)
		ON CONFLICT (org_id, period, metric, level, team_id, user_id) DO UPDATE
		SET units = EXCLUDED.units, updated_at = now()
		WHERE usage_counters.units < EXCLUDED.units
		  AND (usage_counters.adjusted_at IS NULL OR $8::timestamptz IS NULL OR usage_counters.adjusted_at < $8)
		RETURNING org_id, period`, orgs, periods, metrics, levels, teams, users, units, nullTime(drainedAt))
	if err != nil {
		return nil, err
	}
	var out [][2]string
	var o, p string
	_, err = pgx.ForEachRow(res, []any{&o, &p}, func() error { out = append(out, [2]string{o, p}); return nil })
	return out, err
}

// UpsertCounters raises the ledger's rows of org in period to counters' values in tx,
// never lowering one and skipping none (for a close, whose values are final).
func UpsertCounters(ctx context.Context, tx pgx.Tx, org, period string, counters map[quota.Counter]int64) error {
	var rows []batchRow
	for _, r := range rowsOf(counters) {
		rows = append(rows, batchRow{org: org, period: period, counterRow: r})
	}
	for i := 0; i < len(rows); i += upsertChunk {
		if _, err := upsertMany(ctx, tx, rows[i:min(i+upsertChunk, len(rows))], time.Time{}); err != nil {
			return err
		}
	}
	return nil
}

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// RecordDaily raises the daily history of org in period for the UTC day of day to the
// ledger's org-level values of metrics (nil: every metric): the org's cumulative usage
// of the period at the end of that day, as far as it is known now. Like the ledger it
// only rises (GREATEST), so repeated, concurrent and late writes are harmless.
func RecordDaily(ctx context.Context, tx pgx.Tx, org, period string, day time.Time, metrics []string) error {
	d := day.UTC()
	_, err := tx.Exec(ctx, `INSERT INTO usage_daily (org_id, period, metric, day, used)
		SELECT org_id, period, metric, $3::date, units FROM usage_counters
		WHERE org_id = $1 AND period = $2 AND level = 'org' AND ($4::text[] IS NULL OR metric = ANY($4))
		ON CONFLICT (org_id, period, metric, day) DO UPDATE
		SET used = GREATEST(usage_daily.used, EXCLUDED.used), updated_at = now()
		WHERE usage_daily.used < EXCLUDED.used`,
		org, period, time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC), metrics)
	return err
}

// DayUsage is the org's cumulative usage of a metric in a period at the end of a UTC
// day (Day is that day at 00:00 UTC).
type DayUsage struct {
	Day  time.Time
	Used int64
}

// Daily returns the recorded daily history of org in period per metric, oldest first.
func (s *Store) Daily(ctx context.Context, org, period string) (map[string][]DayUsage, error) {
	rows, err := s.pool.Query(ctx, `SELECT metric, day, used FROM usage_daily
		WHERE org_id = $1 AND period = $2 ORDER BY metric, day`, org, period)
	if err != nil {
		return nil, fmt.Errorf("daily usage of %s %s: %w", org, period, err)
	}
	out := map[string][]DayUsage{}
	var metric string
	var d DayUsage
	_, err = pgx.ForEachRow(rows, []any{&metric, &d.Day, &d.Used}, func() error {
		d.Day = time.Date(d.Day.Year(), d.Day.Month(), d.Day.Day(), 0, 0, 0, 0, time.UTC)
		out[metric] = append(out[metric], d)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("daily usage of %s %s: %w", org, period, err)
	}
	return out, nil
}

// reconcile appends, for every counter of a closed period whose ledger value is above
// its closed value plus earlier adjustments, the difference as an adjustment.
func reconcile(ctx context.Context, tx pgx.Tx, org, period string) error {
	_, err := tx.Exec(ctx, `INSERT INTO usage_adjustments (org_id, period, metric, level, team_id, user_id, units)
		SELECT c.org_id, c.period, c.metric, c.level, c.team_id, c.user_id,
		       c.units - coalesce(pu.units, 0) - coalesce(a.units, 0)
		FROM usage_counters c
		LEFT JOIN period_usage pu USING (org_id, period, metric, level, team_id, user_id)
		LEFT JOIN (SELECT metric, level, team_id, user_id, sum(units)::bigint AS units FROM usage_adjustments
		           WHERE org_id = $1 AND period = $2 GROUP BY 1, 2, 3, 4) a USING (metric, level, team_id, user_id)
		WHERE c.org_id = $1 AND c.period = $2 AND c.units > coalesce(pu.units, 0) + coalesce(a.units, 0)`, org, period)
	return err
}

// StoredUsage returns the ledger's value of every counter of org in period: the
// quota engine's Hydrator, called when Redis has lost (or never had) the period.
func (s *Store) StoredUsage(ctx context.Context, org string, period vocab.Period) (map[quota.Counter]int64, error) {
	return s.Usage(ctx, org, period.ID)
}

// Usage returns the ledger's value of every counter of org in period.
func (s *Store) Usage(ctx context.Context, org, period string) (map[quota.Counter]int64, error) {
	rows, err := s.pool.Query(ctx, `SELECT metric, level, team_id, user_id, units FROM usage_counters
		WHERE org_id = $1 AND period = $2`, org, period)
	if err != nil {
		return nil, fmt.Errorf("stored usage of %s %s: %w", org, period, err)
	}
	out := map[quota.Counter]int64{}
	var r counterRow
	_, err = pgx.ForEachRow(rows, []any{&r.metric, &r.level, &r.team, &r.user, &r.units}, func() error {
		out[r.counter()] = r.units
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stored usage of %s %s: %w", org, period, err)
	}
	return out, nil
}

// UsageMany returns the ledger's value of every counter of each org period of ps
// that has any, in one query.
func (s *Store) UsageMany(ctx context.Context, ps []quota.OrgPeriod) (map[quota.OrgPeriod]map[quota.Counter]int64, error) {
	orgs, periods := make([]string, len(ps)), make([]string, len(ps))
	for i, p := range ps {
		orgs[i], periods[i] = p.Org, p.Period
	}
	rows, err := s.pool.Query(ctx, `SELECT c.org_id, c.period, c.metric, c.level, c.team_id, c.user_id, c.units
		FROM unnest($1::text[], $2::text[]) AS x(o, p) JOIN usage_counters c ON c.org_id = x.o AND c.period = x.p`, orgs, periods)
	if err != nil {
		return nil, fmt.Errorf("stored usage of %d org periods: %w", len(ps), err)
	}
	out := map[quota.OrgPeriod]map[quota.Counter]int64{}
	var p quota.OrgPeriod
	var r counterRow
	_, err = pgx.ForEachRow(rows, []any{&p.Org, &p.Period, &r.metric, &r.level, &r.team, &r.user, &r.units}, func() error {
		m := out[p]
		if m == nil {
			m = map[quota.Counter]int64{}
			out[p] = m
		}
		m[r.counter()] = r.units
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stored usage of %d org periods: %w", len(ps), err)
	}
	return out, nil
}

// upsertReservations persists the drained records. A lease's (quota.IsLease) is kept
// only while held, for hydration: settled, its row (if a drain had seen it held) is
// deleted, since a hot path takes several leases a second and nobody reads one back.
func upsertReservations(ctx context.Context, tx pgx.Tx, org string, recs []quota.ReservationRecord) error {
	var settledLeases []string
	for _, r := range recs {
		if quota.IsLease(r.ID) && r.State != vocab.Held {
			settledLeases = append(settledLeases, r.ID)
			continue
		}
		rec, err := json.Marshal(r.Fields)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO reservations (org_id, id, period, state, expires_at, record)
			VALUES ($1, $2, $3, $4, $5, $6)
			ON CONFLICT (org_id, id) DO UPDATE SET state = EXCLUDED.state, expires_at = EXCLUDED.expires_at, record = EXCLUDED.record, updated_at = now()
			WHERE reservations.state = 'held'`, org, r.ID, r.Period, string(r.State), r.ExpiresAt, rec); err != nil {
			return err
		}
	}
	if len(settledLeases) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM reservations WHERE org_id = $1 AND id = ANY($2)`, org, settledLeases); err != nil {
			return err
		}
	}
	return nil
}

// StoredReservations returns the reservations of org in period that were held when
// last persisted, and the settled ones whose record Redis would still keep (a day past
// their expiry), for hydration (quota.ReservationHydrator).
func (s *Store) StoredReservations(ctx context.Context, org string, period vocab.Period) ([]quota.ReservationRecord, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, state, expires_at, record FROM reservations
		WHERE org_id = $1 AND period = $2 AND (state = 'held' OR expires_at > now() - interval '24 hours')`, org, period.ID)
	if err != nil {
		return nil, fmt.Errorf("stored reservations of %s %s: %w", org, period.ID, err)
	}
	var out []quota.ReservationRecord
	var r quota.ReservationRecord
	var rec []byte
	var state string
	_, err = pgx.ForEachRow(rows, []any{&r.ID, &state, &r.ExpiresAt, &rec}, func() error {
		f := map[string]string{}
		if err := json.Unmarshal(rec, &f); err != nil {
			return err
		}
		out = append(out, quota.ReservationRecord{ID: r.ID, Period: period.ID, State: vocab.ReservationState(state), ExpiresAt: r.ExpiresAt, Fields: f})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stored reservations of %s %s: %w", org, period.ID, err)
	}
	return out, nil
}

var _ quota.ReservationHydrator = (*Store)(nil)
