// Package pgdb opens the Postgres pool both binaries share and applies the schema
// migrations. It creates the database when it does not exist yet, so an empty
// server works, and waits for a server that is still starting.
package pgdb

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/quotaplane/quotaplane/internal/platform/redact"
)

// DefaultConnectTimeout bounds each new connection when DATABASE_URL sets no
// connect_timeout. Without it a Postgres that hangs (rather than refusing) would hold
// every request that needs a connection, the tenancy cache's refreshes on the check
// path included, for as long as the OS keeps trying (minutes).
const DefaultConnectTimeout = 3 * time.Second

// ParseConfig parses DATABASE_URL into a pool configuration, with
// DefaultConnectTimeout unless the URL sets connect_timeout.
func ParseConfig(dbURL string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse DATABASE_URL %s: %w", redact.URL(dbURL), err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	return cfg, nil
}

// Trace makes the pool of cfg trace its queries with tp (otelpgx): a span per query,
// batch, prepare, connect and pool acquire, each a child of the span in the
// query's context and none without one. Spans carry the SQL text (parameters are
// $n placeholders), never the arguments. A nil tp leaves cfg as it is.
func Trace(cfg *pgxpool.Config, tp trace.TracerProvider) {
	if tp == nil {
		return
	}
	cfg.ConnConfig.Tracer = otelpgx.NewTracer(otelpgx.WithTracerProvider(tp))
}

// Open connects to the database at dbURL, creating the database first when the
// server answers that it does not exist. While the server cannot be reached it
// retries with backoff until ctx ends, logging each failure with the URL (password
// masked) so an operator sees at once what is missing. With a non-nil tp the
// pool's queries are traced (Trace).
func Open(ctx context.Context, dbURL string, log *slog.Logger, tp trace.TracerProvider) (*pgxpool.Pool, error) {
	cfg, err := ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	Trace(cfg, tp)
	backoff := 200 * time.Millisecond
	for {
		err = ping(ctx, cfg)
		if err == nil {
			return pgxpool.NewWithConfig(ctx, cfg)
		}
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "3D000" { // invalid_catalog_name
			if err = createDatabase(ctx, cfg.ConnConfig); err == nil {
				log.Info("created database", "database", cfg.ConnConfig.Database, "url", redact.URL(dbURL))
				continue
			}
		}
		log.Warn("cannot reach Postgres; retrying", "url", redact.URL(dbURL), "err", err.Error(), "retry_in", backoff.String())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cannot reach Postgres at %s: %w", redact.URL(dbURL), err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

func ping(ctx context.Context, cfg *pgxpool.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

// createDatabase creates cfg.Database through the server's maintenance database.
// A concurrent creator winning the race is not an error.
func createDatabase(ctx context.Context, cfg *pgx.ConnConfig) error {
	admin := cfg.Copy()
	name := admin.Database
	admin.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to maintenance database: %w", err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}
