package tenants

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// limitCols are the columns of a stored org-level limit (plan_limits, org_limits) in
// vocab.Limit's order: a sliding window's NULL burst reads as 0.
const limitCols = `metric, time_window, max_units, coalesce(burst, 0), fair_share`

// ownLimitCols are the columns of a stored team or user limit (team_limits,
// user_limits) in vocab.Limit's order: none is shared (fair_share is an org limit's).
const ownLimitCols = `metric, time_window, max_units, coalesce(burst, 0), false`

// scanLimits scans (owner, limitCols...) rows, or (owner, ownLimitCols...).
func scanLimits(rows pgx.Rows) (map[string][]vocab.Limit, error) {
	out := map[string][]vocab.Limit{}
	var owner string
	var l vocab.Limit
	_, err := pgx.ForEachRow(rows, []any{&owner, &l.Metric, &l.Window, &l.Limit, &l.Burst, &l.FairShare}, func() error {
		out[owner] = append(out[owner], l)
		return nil
	})
	return out, err
}

// limitsOf returns the limits of the owners named, keyed by owner id, each list
// normalized; owners without limits map to an empty list.
func limitsOf(ctx context.Context, q querier, sql string, args ...any) (map[string][]vocab.Limit, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	m, err := scanLimits(rows)
	if err != nil {
		return nil, err
	}
	for k, v := range m {
		m[k] = normalize(v)
	}
	return m, nil
}

// limitArrays splits limits into the column arrays that unnest() takes: a sliding
// window's burst is NULL.
func limitArrays(ls []vocab.Limit) (metrics, windows []string, limits []int64, bursts []*int64, shared []bool) {
	for _, l := range ls {
		metrics = append(metrics, l.Metric)
		windows = append(windows, string(l.Window))
		limits = append(limits, l.Limit)
		bursts = append(bursts, burstCol(l))
		shared = append(shared, l.FairShare)
	}
	return
}

// burstCol is the burst column of l: NULL for a sliding window.
func burstCol(l vocab.Limit) *int64 {
	if !l.Bucket() {
		return nil
	}
	return &l.Burst
}

// replaceLimits deletes the limits matched by del (with delArgs) and inserts ls with
// the insert statement, whose last parameters are the unnest arrays (metric, window,
// limit, burst, and for an org-level table, orgLevel, fair_share).
func replaceLimits(ctx context.Context, tx pgx.Tx, del string, delArgs []any, ins string, ls []vocab.Limit, orgLevel bool) error {
	if _, err := tx.Exec(ctx, del, delArgs...); err != nil {
		return err
	}
	if len(ls) == 0 {
		return nil
	}
	m, w, l, b, f := limitArrays(ls)
	args := append(append([]any{}, delArgs...), m, w, l, b)
	if orgLevel {
		args = append(args, f)
	}
	_, err := tx.Exec(ctx, ins, args...)
	return err
}

// AuditTx records one change in tx, for a package whose change is written by its own
// store in the same transaction (billing's counter adjustments); see audit.
func AuditTx(ctx context.Context, tx pgx.Tx, a Actor, orgID, action, object string, before, after any) error {
	return audit(ctx, tx, a, orgID, action, object, before, after)
}

// audit records one change in the same transaction. before and after are snapshots
// of the object (nil for create or delete); they must carry no secret.
func audit(ctx context.Context, tx pgx.Tx, a Actor, orgID, action, object string, before, after any) error {
	enc := func(v any) ([]byte, error) {
		if v == nil {
			return nil, nil
		}
		return json.Marshal(v)
	}
	b, err := enc(before)
	if err != nil {
		return err
	}
	af, err := enc(after)
	if err != nil {
		return err
	}
	var org *string
	if orgID != "" {
		org = &orgID
	}
	_, err = tx.Exec(ctx, `INSERT INTO audit_log (org_id, actor, action, object, before, after, request_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, org, a.Name, action, object, b, af, a.RequestID)
	if err != nil {
		return fmt.Errorf("write audit row: %w", err)
	}
	return nil
}

// Cursors are opaque to callers: the last key of the page, base64url-encoded.
func encodeCursor(key string) string { return base64.RawURLEncoding.EncodeToString([]byte(key)) }

func decodeCursor(c string) (string, error) {
	if c == "" {
		return "", nil
	}
	// Every key a cursor carries is an id (or an audit row number), so anything else
	// (invalid UTF-8, a NUL, which Postgres refuses in text) was not handed out here.
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || !vocab.ValidID(string(b)) {
		return "", badCursor()
	}
	return string(b), nil
}

// badCursor refuses a cursor the API did not return.
func badCursor() error {
	return &ValidationError{Fields: []FieldError{{Field: "cursor", Message: "is not a cursor this API returned"}}}
}

// pageLimit clamps the page size to 1..1000, 100 by default.
func pageLimit(p Page) int {
	switch {
	case p.Limit <= 0:
		return 100
	case p.Limit > 1000:
		return 1000
	}
	return p.Limit
}

// nextCursor trims a page fetched with one extra row and returns the cursor of the
// next page, "" on the last.
func nextCursor[T any](items []T, limit int, key func(T) string) ([]T, string) {
	if len(items) <= limit {
		return items, ""
	}
	items = items[:limit]
	return items, encodeCursor(key(items[limit-1]))
}

// listPage runs a keyset query for one page: sql takes args, then the cursor's key
// and the page size plus one as its last two parameters. It returns the page and
// the cursor of the next one ("" on the last).
func listPage[T any](ctx context.Context, q querier, what string, page Page, sql string,
	scan func(pgx.Row) (T, error), key func(T) string, args ...any) ([]T, string, error) {
	after, err := decodeCursor(page.Cursor)
	if err != nil {
		return nil, "", err
	}
	n := pageLimit(page)
	rows, err := q.Query(ctx, sql, append(args, after, n+1)...)
	if err != nil {
		return nil, "", fmt.Errorf("list %s: %w", what, err)
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) { return scan(r) })
	if err != nil {
		return nil, "", fmt.Errorf("list %s: %w", what, err)
	}
	items, next := nextCursor(items, n, key)
	return items, next, nil
}

// lockOrg takes the org's row lock, which serializes every allocation change within
// the org, and returns the org with its effective limits.
func lockOrg(ctx context.Context, tx pgx.Tx, orgID string, now time.Time) (Org, error) {
	var id string
	err := tx.QueryRow(ctx, `SELECT id FROM orgs WHERE id = $1 FOR UPDATE`, orgID).Scan(&id)
	if err != nil {
		return Org{}, translate(err, fmt.Sprintf("org %q", orgID))
	}
	return getOrg(ctx, tx, orgID, now)
}
