package pgdb_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

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
	pool, err := pgdb.Open(ctx, dbURL, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
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

// TestConnectToHungPostgresTimesOut: a server that accepts the connection and never
// answers (a hung Postgres) used to hold a new connection for as long as the caller's
// context allowed; with no connect_timeout in the URL it now gives up after
// DefaultConnectTimeout.
func TestConnectToHungPostgresTimesOut(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // read nothing, answer nothing
		}
	}()
	url := "postgres://postgres@" + l.Addr().String() + "/x?sslmode=disable"
	cfg, err := pgdb.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ConnConfig.ConnectTimeout != pgdb.DefaultConnectTimeout {
		t.Errorf("connect timeout %v, want %v", cfg.ConnConfig.ConnectTimeout, pgdb.DefaultConnectTimeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	_, err = pgx.ConnectConfig(ctx, cfg.ConnConfig)
	took := time.Since(t0)
	if err == nil || took > pgdb.DefaultConnectTimeout+2*time.Second {
		t.Errorf("connect to a hung server: %v after %v, want an error after about %v", err, took, pgdb.DefaultConnectTimeout)
	}
	if cfg, _ := pgdb.ParseConfig(url + "&connect_timeout=7"); cfg.ConnConfig.ConnectTimeout != 7*time.Second {
		t.Errorf("connect_timeout=7 gave %v", cfg.ConnConfig.ConnectTimeout)
	}
}
