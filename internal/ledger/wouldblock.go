package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Would-block records (quota's wouldblock.go): the api's engines keep them in Redis,
// the Flusher copies them into would_block (migration 000011) whenever their version
// changed, and billing's Service.WouldBlock reports them, stored and live.

// flushWouldBlock copies org's would-block record of period into Postgres when its
// epoch or version (read by the drain) changed since the last copy. A record written
// while it was read is copied again next time (its version was read first).
func (f *Flusher) flushWouldBlock(ctx context.Context, cs Counters, org, period, epoch string, version int64, seen map[string]string) error {
	if epoch == "" {
		return nil
	}
	mark := fmt.Sprintf("%s:%d", epoch, version)
	f.mu.Lock()
	done := f.wbSeen[org][period] == mark
	f.mu.Unlock()
	if done {
		seen[period] = mark
		return nil
	}
	rec, err := cs.WouldBlock(ctx, org, period)
	if err != nil {
		return err
	}
	if err := f.cfg.Store.PersistWouldBlock(ctx, org, period, rec); err != nil {
		return err
	}
	seen[period] = fmt.Sprintf("%s:%d", rec.Epoch, rec.Version)
	return nil
}

// PersistWouldBlock raises the stored would-block counts of org in period to rec's
// (GREATEST: a stale or repeated write changes nothing), under rec's epoch.
func (s *Store) PersistWouldBlock(ctx context.Context, org, period string, rec quota.WouldBlockRecord) error {
	if len(rec.Counts) == 0 {
		return nil
	}
	keys := make([]quota.WouldBlockKey, 0, len(rec.Counts))
	for k := range rec.Counts {
		keys = append(keys, k)
	}
	// One order everywhere, so concurrent upserts lock rows in the same order.
	slices.SortFunc(keys, wbCompare)
	n := len(keys)
	metrics, levels, teams, users, wins, days := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	checks, units := make([]int64, n), make([]int64, n)
	for i, k := range keys {
		c := rec.Counts[k]
		metrics[i], levels[i], teams[i], users[i], wins[i], days[i] = k.Metric, string(k.Level), k.Team, k.User, string(k.Window), k.Day
		checks[i], units[i] = c.Checks, c.Units
	}
	err := s.InTx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO would_block (org_id, period, epoch, metric, level, team_id, user_id, win, day, checks, units)
			SELECT $1, $2, $3, m, l, t, u, w, d::date, c, n
			FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[]) AS x(m, l, t, u, w, d, c, n)
			ON CONFLICT (org_id, period, epoch, metric, level, team_id, user_id, win, day) DO UPDATE
			SET checks = GREATEST(would_block.checks, EXCLUDED.checks), units = GREATEST(would_block.units, EXCLUDED.units), updated_at = now()
			WHERE would_block.checks < EXCLUDED.checks OR would_block.units < EXCLUDED.units`,
			org, period, rec.Epoch, metrics, levels, teams, users, wins, days, checks, units)
		return err
	})
	if err != nil {
		return fmt.Errorf("persist would-block record of %s %s: %w", org, period, err)
	}
	return nil
}

func wbCompare(a, b quota.WouldBlockKey) int {
	return cmp.Or(cmp.Compare(a.Metric, b.Metric), cmp.Compare(a.Level, b.Level), cmp.Compare(a.Team, b.Team),
		cmp.Compare(a.User, b.User), cmp.Compare(a.Window, b.Window), cmp.Compare(a.Day, b.Day))
}

// StoredWouldBlock reads the stored would-block counts of org in period by epoch.
func (s *Store) StoredWouldBlock(ctx context.Context, org, period string) (map[string]map[quota.WouldBlockKey]quota.WouldBlockCount, error) {
	rows, err := s.pool.Query(ctx, `SELECT epoch, metric, level, team_id, user_id, win, to_char(day, 'YYYY-MM-DD'), checks, units
		FROM would_block WHERE org_id = $1 AND period = $2`, org, period)
	if err != nil {
		return nil, fmt.Errorf("would-block record of %s %s: %w", org, period, err)
	}
	out := map[string]map[quota.WouldBlockKey]quota.WouldBlockCount{}
	var epoch, level, win string
	var k quota.WouldBlockKey
	var c quota.WouldBlockCount
	_, err = pgx.ForEachRow(rows, []any{&epoch, &k.Metric, &level, &k.Team, &k.User, &win, &k.Day, &c.Checks, &c.Units}, func() error {
		k.Level, k.Window = vocab.Level(level), vocab.Window(win)
		if out[epoch] == nil {
			out[epoch] = map[quota.WouldBlockKey]quota.WouldBlockCount{}
		}
		out[epoch][k] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("would-block record of %s %s: %w", org, period, err)
	}
	return out, nil
}
