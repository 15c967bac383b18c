package pgdb_test

import (
	"context"
	"io"
	"log/slog"
	"net/url"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

func tableCount(t *testing.T, dbURL string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	err = c.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables
		WHERE table_schema = 'public' AND table_name <> 'schema_migrations'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMigrateUpDownUp(t *testing.T) {
	dbURL := testenv.PostgresURL(t) // already migrated up
	up := tableCount(t, dbURL)
	if up < 10 {
		t.Fatalf("after up: %d tables, want the whole schema", up)
	}
	if err := pgdb.MigrateDown(dbURL); err != nil {
		t.Fatal(err)
	}
	if n := tableCount(t, dbURL); n != 0 {
		t.Fatalf("after down: %d tables left, want 0", n)
	}
	if err := pgdb.Migrate(dbURL); err != nil {
		t.Fatal(err)
	}
	if n := tableCount(t, dbURL); n != up {
		t.Fatalf("after up again: %d tables, want %d", n, up)
	}
}

// Replicas start together: concurrent migrations on an empty database that does not
// even exist yet must all succeed and apply each migration once.
func TestOpenCreatesDatabaseAndConcurrentMigrate(t *testing.T) {
	fresh := testenv.PostgresURL(t)
	u, _ := url.Parse(fresh)
	u.Path = u.Path + "_new"
	dbURL := u.String()
	ctx := context.Background()
	pool, err := pgdb.Open(ctx, dbURL, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		if c, err := pgx.Connect(ctx, fresh); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{u.Path[1:]}.Sanitize()+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- pgdb.Migrate(dbURL) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent migrate: %v", err)
		}
	}
	if n := tableCount(t, dbURL); n < 10 {
		t.Fatalf("%d tables after concurrent migrate", n)
	}
}

func TestMaskURL(t *testing.T) {
	got := pgdb.MaskURL("postgres://app:s3cret@db:5432/q?sslmode=disable")
	if got != "postgres://app:xxxxx@db:5432/q?sslmode=disable" {
		t.Fatalf("MaskURL = %q", got)
	}
}
