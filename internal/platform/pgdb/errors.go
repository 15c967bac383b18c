package pgdb

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/quotaplane/quotaplane/internal/derrors"
)

// Translate returns err as a derrors.Unavailable error when it says that Postgres
// could not be reached or the connection was lost during the request, rather than that
// the request was wrong: a refused or failed connection, a server that crashed or was
// stopped under a query in flight (pgx reports unexpected EOF), one shutting down or
// starting up (SQLSTATE class 08, 57P01-57P05), or a query that never reached it
// (pgconn.SafeToRetry). Other errors, and a context the caller canceled, are returned
// as they are.
func Translate(err error) error {
	// No rows is an answer, and the commonest error: it costs no errors.As.
	if err == nil || errors.Is(err, pgx.ErrNoRows) || errors.Is(err, context.Canceled) || !unavailable(err) {
		return err
	}
	return derrors.E(derrors.Unavailable, "the database is unavailable; retry shortly", err)
}

func unavailable(err error) bool {
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.As(err, &pgErr):
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	case errors.As(err, &connErr), errors.As(err, &netErr), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return pgconn.SafeToRetry(err)
}

// DB is a pool whose errors say when Postgres is unavailable (see Translate), so the
// stores built on it report derrors.Unavailable without knowing pgx's errors. The
// errors of a transaction's own statements are the caller's to translate (InTx-style
// helpers pass their result through Translate).
type DB struct{ *pgxpool.Pool }

// Exec runs sql.
func (db DB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t, err := db.Pool.Exec(ctx, sql, args...)
	return t, Translate(err)
}

// Query runs sql; the rows' errors are translated too.
func (db DB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rs, err := db.Pool.Query(ctx, sql, args...)
	if err != nil {
		return rs, Translate(err)
	}
	return rows{rs}, nil
}

// QueryRow runs sql; Scan's error is translated.
func (db DB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return row{db.Pool.QueryRow(ctx, sql, args...)}
}

// Begin starts a transaction.
func (db DB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := db.Pool.Begin(ctx)
	return tx, Translate(err)
}

// Ping reports whether Postgres answers.
func (db DB) Ping(ctx context.Context) error { return Translate(db.Pool.Ping(ctx)) }

type rows struct{ pgx.Rows }

func (r rows) Err() error             { return Translate(r.Rows.Err()) }
func (r rows) Scan(dest ...any) error { return Translate(r.Rows.Scan(dest...)) }
func (r rows) Values() ([]any, error) { v, err := r.Rows.Values(); return v, Translate(err) }

type row struct{ pgx.Row }

func (r row) Scan(dest ...any) error { return Translate(r.Row.Scan(dest...)) }
