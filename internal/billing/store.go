package billing

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Store is the billing record in Postgres (closed periods, their usage and billing
// lines, exports) over the usage ledger it reads and, for a close or an adjustment,
// writes in the same transaction.
type Store struct {
	pool   pgdb.DB // its errors match derrors.Unavailable when Postgres is down
	ledger *ledger.Store
}

// NewStore returns a Store on pool.
func NewStore(pool *pgxpool.Pool) *Store {
	return &Store{pool: pgdb.DB{Pool: pool}, ledger: ledger.NewStore(pool)}
}

// Ledger is the usage ledger the Store reads.
func (s *Store) Ledger() *ledger.Store { return s.ledger }

func (s *Store) closed(ctx context.Context, org, period string) (bool, error) {
	var closed bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM billing_periods WHERE org_id = $1 AND period = $2)`,
		org, period).Scan(&closed)
	return closed, err
}

// ClosedUsage returns the final usage of a closed period (closed units plus late
// adjustments) with the month limit of each counter at close, and whether the period
// is closed at all.
func (s *Store) ClosedUsage(ctx context.Context, org, period string) (map[quota.Counter]int64, map[quota.Counter]int64, bool, error) {
	var closed bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM billing_periods WHERE org_id = $1 AND period = $2)`,
		org, period).Scan(&closed); err != nil || !closed {
		return nil, nil, false, err
	}
	rows, err := s.pool.Query(ctx, `SELECT metric, level, team_id, user_id, sum(units)::bigint, coalesce(max(month_limit), -1)
		FROM (SELECT metric, level, team_id, user_id, units, month_limit FROM period_usage WHERE org_id = $1 AND period = $2
		      UNION ALL
		      SELECT metric, level, team_id, user_id, units, NULL FROM usage_adjustments WHERE org_id = $1 AND period = $2) x
		GROUP BY 1, 2, 3, 4`, org, period)
	if err != nil {
		return nil, nil, true, err
	}
	usage, limits := map[quota.Counter]int64{}, map[quota.Counter]int64{}
	var r counterRow
	var limit int64
	_, err = pgx.ForEachRow(rows, []any{&r.metric, &r.level, &r.team, &r.user, &r.units, &limit}, func() error {
		usage[r.counter()] = r.units
		if limit >= 0 {
			limits[r.counter()] = limit
		}
		return nil
	})
	return usage, limits, true, err
}

// recordAdjustment writes an adjusted counter's ledger row (whatever it was before)
// with adjusted_at, caps the org's daily history of the period at the new value for a
// lowered org counter, and writes the audit row, in one transaction under the period's
// lock (a flush's persist is before or after it, never in between).
func (s *Store) recordAdjustment(ctx context.Context, a tenants.Actor, adj Adjustment) error {
	c := adj.Counter
	err := s.ledger.InTx(ctx, func(tx pgx.Tx) error {
		if err := ledger.PeriodLock(ctx, tx, adj.Org, adj.Period); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO usage_counters (org_id, period, metric, level, team_id, user_id, units, adjusted_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (org_id, period, metric, level, team_id, user_id) DO UPDATE
			SET units = EXCLUDED.units, adjusted_at = EXCLUDED.adjusted_at, updated_at = now()`,
			adj.Org, adj.Period, c.Metric, string(c.Level), c.Team, c.User, adj.After, adj.At); err != nil {
			return err
		}
		if c.Level == vocab.LevelOrg {
			if _, err := tx.Exec(ctx, `UPDATE usage_daily SET used = $4, updated_at = now()
				WHERE org_id = $1 AND period = $2 AND metric = $3 AND used > $4`,
				adj.Org, adj.Period, c.Metric, adj.After); err != nil {
				return err
			}
		}
		snap := func(units int64, reason string) auditAdjustment {
			return auditAdjustment{Period: adj.Period, Metric: c.Metric, Level: string(c.Level), Team: c.Team, User: c.User,
				Units: units, Reason: reason}
		}
		return tenants.AuditTx(ctx, tx, a, adj.Org, "usage.adjust", "usage:"+adj.Period+":"+counterObject(c),
			snap(adj.Before, ""), snap(adj.After, adj.Reason))
	})
	if err != nil {
		if !errors.Is(err, derrors.Unavailable) {
			err = fmt.Errorf("%w: %w", quota.ErrUnavailable, err)
		}
		return fmt.Errorf("adjust usage of %s %s: ledger: %w", adj.Org, adj.Period, err)
	}
	return nil
}
