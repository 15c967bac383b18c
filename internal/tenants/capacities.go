package tenants

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Capacity is the operator's limit above every org (docs/ARCHITECTURE.md "Capacities
// and fair share"): Limit units of Metric in one sliding Window (second to day), drawn
// on by every check of that metric, from any org, all or nothing with the org's own
// limits. Above Saturation x Limit used in the window an org is admitted only within
// its weighted fair share of it.
type Capacity struct {
	ID     string       `json:"id"`
	Metric string       `json:"metric"`
	Window vocab.Window `json:"window"`
	Limit  int64        `json:"limit"`
	// Saturation is in (0, 1].
	Saturation float64   `json:"saturation"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}

// DefaultSaturation is a capacity's saturation when its input gives none.
const DefaultSaturation = 0.8

// CapacityInput creates a capacity.
type CapacityInput struct {
	ID         string
	Metric     string
	Window     vocab.Window
	Limit      int64
	Saturation float64 // 0 means DefaultSaturation
}

// CapacityPatch changes the fields that are set. A capacity's metric and window stay
// as made: its window's state in Redis is counted in sub-buckets of its window.
type CapacityPatch struct {
	Limit      *int64
	Saturation *float64
}

func checkCapacityLimit(errs *fieldErrs, n int64) {
	if n < 1 || n > vocab.MaxUnits {
		errs.add("limit", "must be 1 to %d", vocab.MaxUnits)
	}
}

func checkSaturation(errs *fieldErrs, s float64) {
	if math.IsNaN(s) || s <= 0 || s > 1 {
		errs.add("saturation", "must be above 0 and at most 1 (the share of the limit used in the window above which fair shares apply)")
	}
}

// Validate reports every problem of in.
func (in CapacityInput) Validate() error {
	var errs fieldErrs
	checkID(&errs, "id", in.ID)
	checkID(&errs, "metric", in.Metric)
	if in.Window.Duration() <= 0 {
		errs.add("window", "must be one of second, minute, hour, day")
	}
	checkCapacityLimit(&errs, in.Limit)
	if in.Saturation != 0 {
		checkSaturation(&errs, in.Saturation)
	}
	return errs.err()
}

// Validate reports every problem of p.
func (p CapacityPatch) Validate() error {
	var errs fieldErrs
	if p.Limit != nil {
		checkCapacityLimit(&errs, *p.Limit)
	}
	if p.Saturation != nil {
		checkSaturation(&errs, *p.Saturation)
	}
	return errs.err()
}

// capacitiesTopic is announced to the change listeners (and so on the invalidation
// channel) when a capacity changes: no org id holds '|', so it never names an org.
const capacitiesTopic = "|capacities"

const capacityCols = `id, metric, time_window, max_units, saturation, created_at, updated_at`

func scanCapacity(row pgx.Row) (Capacity, error) {
	var c Capacity
	err := row.Scan(&c.ID, &c.Metric, &c.Window, &c.Limit, &c.Saturation, &c.CreatedAt, &c.UpdatedAt)
	return c, err
}

func getCapacity(ctx context.Context, q querier, id string, forUpdate bool) (Capacity, error) {
	sql := `SELECT ` + capacityCols + ` FROM capacities WHERE id = $1`
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	c, err := scanCapacity(q.QueryRow(ctx, sql, id))
	return c, translate(err, fmt.Sprintf("capacity %q", id))
}

// CreateCapacity creates a capacity. Every replica's checks draw on it within a
// moment (the capacities' cache, Cache.Capacities).
func (s *Service) CreateCapacity(ctx context.Context, a Actor, in CapacityInput) (Capacity, error) {
	if err := in.Validate(); err != nil {
		return Capacity{}, err
	}
	if in.Saturation == 0 {
		in.Saturation = DefaultSaturation
	}
	var out Capacity
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		out, err = scanCapacity(tx.QueryRow(ctx, `INSERT INTO capacities (id, metric, time_window, max_units, saturation)
			VALUES ($1, $2, $3, $4, $5) RETURNING `+capacityCols, in.ID, in.Metric, in.Window, in.Limit, in.Saturation))
		if err != nil {
			return translate(err, fmt.Sprintf("create capacity %q", in.ID))
		}
		return audit(ctx, tx, a, "", "capacity.create", "capacity:"+in.ID, nil, out)
	})
	if err == nil {
		s.changed(capacitiesTopic)
	}
	return out, err
}

// GetCapacity returns the capacity with id.
func (s *Service) GetCapacity(ctx context.Context, id string) (Capacity, error) {
	return getCapacity(ctx, s.pool, id, false)
}

// ListCapacities returns one page of capacities ordered by id, and the cursor of the
// next page.
func (s *Service) ListCapacities(ctx context.Context, page Page) ([]Capacity, string, error) {
	return listPage(ctx, s.pool, "capacities", page, `SELECT `+capacityCols+` FROM capacities WHERE id > $1 ORDER BY id LIMIT $2`,
		scanCapacity, func(c Capacity) string { return c.ID })
}

// AllCapacities returns every capacity, ordered by id: what the cache holds.
func (s *Service) AllCapacities(ctx context.Context) ([]Capacity, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+capacityCols+` FROM capacities ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list capacities: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Capacity, error) { return scanCapacity(r) })
	if err != nil {
		return nil, fmt.Errorf("list capacities: %w", err)
	}
	return out, nil
}

// UpdateCapacity changes a capacity's limit or saturation.
func (s *Service) UpdateCapacity(ctx context.Context, a Actor, id string, patch CapacityPatch) (Capacity, error) {
	if err := patch.Validate(); err != nil {
		return Capacity{}, err
	}
	var out Capacity
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		before, err := getCapacity(ctx, tx, id, true)
		if err != nil {
			return err
		}
		after := before
		if patch.Limit != nil {
			after.Limit = *patch.Limit
		}
		if patch.Saturation != nil {
			after.Saturation = *patch.Saturation
		}
		out, err = scanCapacity(tx.QueryRow(ctx, `UPDATE capacities SET max_units = $2, saturation = $3, updated_at = now()
			WHERE id = $1 RETURNING `+capacityCols, id, after.Limit, after.Saturation))
		if err != nil {
			return fmt.Errorf("update capacity %q: %w", id, err)
		}
		return audit(ctx, tx, a, "", "capacity.update", "capacity:"+id, before, out)
	})
	if err == nil {
		s.changed(capacitiesTopic)
	}
	return out, err
}

// DeleteCapacity deletes a capacity: checks stop drawing on it within a moment.
func (s *Service) DeleteCapacity(ctx context.Context, a Actor, id string) error {
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		before, err := getCapacity(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM capacities WHERE id = $1`, id); err != nil {
			return fmt.Errorf("delete capacity %q: %w", id, err)
		}
		return audit(ctx, tx, a, "", "capacity.delete", "capacity:"+id, before, nil)
	})
	if err == nil {
		s.changed(capacitiesTopic)
	}
	return err
}

// CapacitySet is every capacity by metric, as the cache holds it: read only.
type CapacitySet struct {
	byMetric map[string][]Capacity
}

func newCapacitySet(cs []Capacity) CapacitySet {
	m := make(map[string][]Capacity, len(cs))
	for _, c := range cs {
		m[c.Metric] = append(m[c.Metric], c)
	}
	return CapacitySet{byMetric: m}
}

// Of returns the capacities of metric (nil when none), not to be changed.
func (s CapacitySet) Of(metric string) []Capacity { return s.byMetric[metric] }

// Len is the number of metrics with a capacity.
func (s CapacitySet) Len() int { return len(s.byMetric) }
