// Package worker wires the River job queue of quotaplane-worker: River's own schema
// migrations, the client, and every job a worker runs: the heartbeat, the period
// close scan and close (internal/billing's Closer) and webhook delivery
// (internal/webhooks' Deliverer). River is imported here only; the domain packages
// are called by the jobs' workers as plain functions.
package worker

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
	"github.com/riverqueue/rivercontrib/otelriver"
	"go.opentelemetry.io/otel/trace"
)

// riverMigrationLock serializes River's migrations across processes starting at
// once; golang-migrate has its own lock for the application schema.
const riverMigrationLock = 727301

// MigrateRiver applies River's schema migrations under an advisory lock.
func MigrateRiver(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", riverMigrationLock); err != nil {
		return fmt.Errorf("river migrations: lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", riverMigrationLock)
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrations: %w", err)
	}
	return nil
}

// Config configures the queue client.
type Config struct {
	ID             string        // this worker's id; default host-pid
	HeartbeatEvery time.Duration // default 15s
	// Logger receives River's messages, its routine ones (job counts, maintenance
	// runs) at debug.
	Logger *slog.Logger
	// Jobs, when set, adds period close, its periodic scan and webhook delivery.
	Jobs *Jobs
	// MaxWorkers bounds the jobs run at once (default 10).
	MaxWorkers int
	// TracerProvider, when set, gives every job a span ("river.work/<kind>", otelriver),
	// its Postgres queries under it; nil traces nothing.
	TracerProvider trace.TracerProvider
}

// DefaultID names this worker process: host-pid.
func DefaultID() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// NewClient returns a River client with every job of the worker registered. Start
// and Stop it; Stop waits for running jobs.
func NewClient(pool *pgxpool.Pool, cfg Config) (*river.Client[pgx.Tx], error) {
	host, _ := os.Hostname()
	if cfg.ID == "" {
		cfg.ID = DefaultID()
	}
	if cfg.HeartbeatEvery <= 0 {
		cfg.HeartbeatEvery = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxWorkers <= 0 {
		cfg.MaxWorkers = 10
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &heartbeatWorker{pool: pool, host: host, started: time.Now()})
	periodic := []*river.PeriodicJob{
		river.NewPeriodicJob(river.PeriodicInterval(cfg.HeartbeatEvery),
			func() (river.JobArgs, *river.InsertOpts) { return HeartbeatArgs{}, nil },
			&river.PeriodicJobOpts{RunOnStart: true}),
	}
	if cfg.Jobs != nil {
		cfg.Jobs.register(workers)
		periodic = append(periodic, cfg.Jobs.periodic()...)
	}
	var middleware []rivertype.Middleware
	if cfg.TracerProvider != nil {
		middleware = append(middleware, otelriver.NewMiddleware(&otelriver.MiddlewareConfig{TracerProvider: cfg.TracerProvider,
			EnableWorkSpanJobKindSuffix: true}))
	}
	return river.NewClient(riverpgxv5.New(pool), &river.Config{
		Middleware:   middleware,
		ID:           cfg.ID,
		Logger:       slog.New(quietRoutine{cfg.Logger.Handler()}).With("component", "river"),
		Queues:       map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.MaxWorkers}},
		PeriodicJobs: periodic,
		Workers:      workers,
	})
}

// HeartbeatArgs is the periodic job that proves the queue runs jobs: it records
// which worker ran it and when.
type HeartbeatArgs struct{}

// Kind names the job in River's tables.
func (HeartbeatArgs) Kind() string { return "worker.heartbeat" }

type heartbeatWorker struct {
	river.WorkerDefaults[HeartbeatArgs]
	pool    *pgxpool.Pool
	host    string
	started time.Time
}

func (w *heartbeatWorker) Work(ctx context.Context, job *river.Job[HeartbeatArgs]) error {
	client := river.ClientFromContext[pgx.Tx](ctx)
	_, err := w.pool.Exec(ctx, `INSERT INTO worker_heartbeats (worker_id, hostname, started_at, seen_at)
		VALUES ($1, $2, $3, now())
		ON CONFLICT (worker_id) DO UPDATE SET seen_at = now()`, client.ID(), w.host, w.started)
	return err
}

// LastHeartbeat returns when any worker last ran the heartbeat job; zero when none has.
func LastHeartbeat(ctx context.Context, pool *pgxpool.Pool) (time.Time, error) {
	var t *time.Time
	err := pool.QueryRow(ctx, `SELECT max(seen_at) FROM worker_heartbeats`).Scan(&t)
	if err != nil || t == nil {
		return time.Time{}, err
	}
	return *t, nil
}
