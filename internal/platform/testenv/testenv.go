package testenv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	tcredis "github.com/testcontainers/testcontainers-go/modules/redis"

	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/migrations"
)

const (
	localPostgres = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	localRedis    = "redis://127.0.0.1:6379/0"
)

var (
	pgOnce    sync.Once
	pgBase    string // URL of a maintenance database on the test server
	pgErr     error
	redisOnce sync.Once
	redisBase string
	redisErr  error
	cloneMu   sync.Mutex
)

// unavailable fails the test under CI=true and skips it elsewhere.
func unavailable(tb testing.TB, what string, err error) {
	tb.Helper()
	msg := fmt.Sprintf("no %s for tests: %v (set %s, start the local server, or run Docker)", what, err,
		map[string]string{"Postgres": "DATABASE_URL", "Redis": "REDIS_URL"}[what])
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}

func reachable(hostport string) bool {
	c, err := net.DialTimeout("tcp", hostport, 500*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func postgresBase() (string, error) {
	pgOnce.Do(func() {
		switch {
		case os.Getenv("DATABASE_URL") != "":
			pgBase = os.Getenv("DATABASE_URL")
		case reachable("127.0.0.1:5432"):
			pgBase = localPostgres
		default:
			ctx := context.Background()
			c, err := tcpostgres.Run(ctx, "postgres:16-alpine",
				tcpostgres.WithDatabase("postgres"), tcpostgres.WithUsername("postgres"),
				tcpostgres.WithPassword("postgres"), tcpostgres.BasicWaitStrategies())
			if err != nil {
				pgErr = fmt.Errorf("start Postgres container: %w", err)
				return
			}
			pgBase, pgErr = c.ConnectionString(ctx, "sslmode=disable")
		}
	})
	return pgBase, pgErr
}

// migrationsHash names the template database after the migrations it holds, so a
// changed migration gets a new template and an unchanged one is reused across runs.
func migrationsHash() string {
	h := sha256.New()
	_ = fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(migrations.FS, path)
		h.Write([]byte(path))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func withDatabase(base, db string) string {
	u, _ := url.Parse(base)
	u.Path = "/" + db
	return u.String()
}

// ensureTemplate creates the migrated template database once; a Postgres advisory
// lock keeps test processes of other packages from racing on it.
func ensureTemplate(ctx context.Context, admin *pgx.Conn, base string) (string, error) {
	name := "qp_tpl_" + migrationsHash()
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(727274)"); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock(727274)")
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_build"
	_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)")
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", err
	}
	if err := pgdb.Migrate(withDatabase(base, building)); err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	// Rename only when complete, so a crash mid-build never leaves a half template.
	if _, err := admin.Exec(ctx, "ALTER DATABASE "+building+" RENAME TO "+name); err != nil {
		return "", err
	}
	return name, nil
}

// PostgresURL returns the URL of a fresh, migrated database that is dropped when the
// test ends.
func PostgresURL(tb testing.TB) string {
	tb.Helper()
	base, err := postgresBase()
	if err != nil {
		unavailable(tb, "Postgres", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		unavailable(tb, "Postgres", err)
	}
	defer admin.Close(context.Background())
	tpl, err := ensureTemplate(ctx, admin, base)
	if err != nil {
		tb.Fatalf("testenv: template database: %v", err)
	}
	name := "qp_t_" + randHex(6)
	cloneMu.Lock()
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+tpl)
		var pe *pgconn.PgError
		if err == nil || attempt == 20 || !errors.As(err, &pe) || pe.Code != "55006" { // object_in_use
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	cloneMu.Unlock()
	if err != nil {
		tb.Fatalf("testenv: create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, base); err == nil {
			_, _ = c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = c.Close(ctx)
		}
	})
	return withDatabase(base, name)
}

// Postgres returns a pool on a fresh, migrated database; both are gone when the test
// ends.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), PostgresURL(tb))
	if err != nil {
		tb.Fatalf("testenv: open pool: %v", err)
	}
	tb.Cleanup(pool.Close) // registered after the drop, so it runs before it
	return pool
}

// RedisURL returns the URL of the Redis that tests share. Tests must keep to keys
// of their own (unique ids or key prefixes from ID) and never flush it.
func RedisURL(tb testing.TB) string {
	tb.Helper()
	redisOnce.Do(func() {
		switch {
		case os.Getenv("REDIS_URL") != "":
			redisBase = os.Getenv("REDIS_URL")
		case reachable("127.0.0.1:6379"):
			redisBase = localRedis
		default:
			ctx := context.Background()
			c, err := tcredis.Run(ctx, "redis:7-alpine")
			if err != nil {
				redisErr = fmt.Errorf("start Redis container: %w", err)
				return
			}
			redisBase, redisErr = c.ConnectionString(ctx)
		}
	})
	if redisErr != nil {
		unavailable(tb, "Redis", redisErr)
	}
	return redisBase
}

// Redis returns a client on the shared test Redis, closed when the test ends.
func Redis(tb testing.TB) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(RedisURL(tb))
	if err != nil {
		tb.Fatalf("testenv: parse REDIS_URL: %v", err)
	}
	c := redis.NewClient(opt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unavailable(tb, "Redis", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// ID returns prefix followed by a random suffix: an id valid under the API's id
// pattern that no other test uses.
func ID(tb testing.TB, prefix string) string {
	tb.Helper()
	return prefix + "-" + randHex(4)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, for servers a
// test starts itself (redis-server, postgres, quotaplane binaries).
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
