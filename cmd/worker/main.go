// Command quotaplane-worker keeps usage durable and closes billing periods: it
// applies the schema and River's migrations, persists live usage every
// QUOTA_FLUSH_INTERVAL, runs the job queue (period close, webhooks) and serves
// /healthz and /metrics for operators.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/riverqueue/river"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/config"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/platform/faultclock"
	"github.com/quotaplane/quotaplane/internal/platform/healthcheck"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/platform/redisconn"
	"github.com/quotaplane/quotaplane/internal/platform/tracing"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/internal/worker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" { // docker-compose.yml's healthcheck
		if err := healthcheck.Run(ctx, os.Args[2:], "http://127.0.0.1:8081/healthz"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, os.Getenv, os.Stderr); err != nil {
		// JSON like every other line, so a log pipeline reads why the worker stopped.
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("quotaplane-worker stopped", "err", err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, getenv func(string) string, stderr io.Writer) error {
	cfg, err := config.LoadWorker(getenv)
	if err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	redisconn.LogTo(log)
	log.Info("starting quotaplane-worker", "config", cfg)
	// Bind before anything slow, so a busy address fails at once; /healthz answers
	// once the queue and the flusher run.
	ln, err := config.Listen("QUOTA_WORKER_HTTP_ADDR", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	defer ln.Close()

	// Spans are exported when OTEL_EXPORTER_OTLP_ENDPOINT is set; the last ones are
	// flushed once everything that makes them has stopped (deferred first, runs last).
	tp, stopTracing, err := tracing.Start(ctx, tracing.WorkerService, getenv, log)
	if err != nil {
		return err
	}
	defer stopTracing()

	startCtx, cancel := context.WithTimeout(ctx, cfg.StartupTimeout)
	defer cancel()
	pool, err := pgdb.Open(startCtx, cfg.DatabaseURL, log, tp)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := pgdb.Migrate(cfg.DatabaseURL); err != nil {
		return err
	}
	if err := worker.MigrateRiver(startCtx, pool); err != nil {
		return err
	}
	if cfg.WebhookSecret == "" {
		log.Warn("QUOTA_WEBHOOK_SECRET is not set: events are recorded but no webhook is sent")
	}

	// Live counters are read where the api counts them: REDIS_URL, the pools of
	// QUOTA_REDIS_POOLS, or an org's dedicated Redis; engine clients never retry.
	id := worker.DefaultID()
	// A test hook, off by default: QUOTA_FAULT_CLOCK=on lets SIGUSR1/SIGUSR2 step the
	// engines' wall clock by +-2 s, which must change no sweep or period close.
	// Every key starts with QUOTA_REDIS_PREFIX, as the api's do.
	engine := quota.Config{KeyPrefix: cfg.RedisPrefix}
	if cfg.FaultClock {
		fc := quota.NewStepClock()
		fc.Use(&engine)
		faultclock.Install(ctx, fc, log)
	}
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: redisconn.Canonical(cfg.RedisURL, cfg.RedisCluster), Pools: cfg.RedisPools,
		RedisTimeout: 5 * time.Second, // reads, not the check path: no short timeouts
		Registerer:   prometheus.DefaultRegisterer, Engine: engine})
	if err != nil {
		return err
	}
	defer router.Close()
	engines := ledger.EngineCounters(router)
	// Grants lapse, and periods are flushed and closed, on the engines' clock (Redis
	// time on the monotonic clock), as checks count them: a stepped local clock moves
	// no period end.
	svc := tenants.NewService(pool, tenants.WithClock(router.DefaultNow))
	store := billing.NewStore(pool)
	prometheus.MustRegister(collectors.NewBuildInfoCollector()) // go_build_info: which build runs
	metrics := billing.NewMetrics(prometheus.DefaultRegisterer)
	worker.RegisterMetrics(prometheus.DefaultRegisterer, pool)
	var client *river.Client[pgx.Tx]
	queue := func() webhooks.Enqueuer { return worker.DeliveryQueue(client) }
	if cfg.WebhookSecret == "" {
		queue = nil
	}
	closer := billing.NewCloser(billing.CloserConfig{Store: store, Tenants: svc, Counters: engines, Queue: queue,
		Clock: router.DefaultNow, Grace: cfg.CloseGrace, WorkerID: id, Logger: log, Metrics: metrics})
	hook := &worker.WebhookWorker{Deliverer: &webhooks.Deliverer{Store: webhooks.NewStore(pool), Tenants: svc, Secret: []byte(cfg.WebhookSecret),
		Client: webhooks.NewClient(10*time.Second, cfg.WebhookAllowPrivate), Metrics: webhooks.NewMetrics(prometheus.DefaultRegisterer)}}
	client, err = worker.NewClient(pool, worker.Config{ID: id, Logger: log, TracerProvider: tp,
		Jobs: &worker.Jobs{Closer: closer, Webhook: hook}})
	if err != nil {
		return err
	}
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("start job queue: %w", err)
	}
	flusher := ledger.NewFlusher(ledger.FlusherConfig{Store: store.Ledger(), Tenants: svc, Counters: engines, Queue: queue,
		Interval: cfg.FlushInterval, Clock: router.DefaultNow, Logger: log, Metrics: ledger.NewMetrics(prometheus.DefaultRegisterer),
		CacheOrgs: cfg.CacheOrgs, CacheMetrics: cachemetrics.New(prometheus.DefaultRegisterer), TracerProvider: tp})
	flushCtx, stopFlushing := context.WithCancel(ctx)
	defer stopFlushing()
	// Limits changed through an api replica reach the flusher as they reach the other
	// replicas' caches: on the invalidation channel of QUOTA_REDIS_PREFIX.
	rdb, err := redisconn.New(cfg.RedisURL, cfg.RedisCluster)
	if err != nil {
		return err
	}
	defer rdb.Close()
	tenants.Subscribe(flushCtx, rdb, tenants.ChannelFor(cfg.RedisPrefix), func(org string) { flusher.LimitsChanged(org) }, flusher.AllLimitsChanged)
	flushed := make(chan struct{})
	go func() { flusher.Run(flushCtx); close(flushed) }()
	// Reservations left open past their expiry are settled by their on_expiry within
	// the sweep interval; every worker sweeps, and each is settled once (settle.lua).
	swept := make(chan struct{})
	go func() {
		router.RunReservationSweep(flushCtx, cfg.ReservationSweep, func(err error) {
			log.Warn("reservation sweep incomplete", "err", err.Error())
		})
		close(swept)
	}()

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"status":"ok"}`)
	})
	mux.Handle("GET /metrics", promhttp.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("worker running", "health", "http://"+ln.Addr().String()+"/healthz")

	select {
	case err = <-errc:
		err = fmt.Errorf("serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	log.Info("shutting down: final usage flush, waiting for running jobs")
	stopFlushing()
	<-flushed
	<-swept
	stopCtx, cancelStop := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelStop()
	_ = srv.Shutdown(stopCtx)
	if stopErr := client.Stop(stopCtx); stopErr != nil && !errors.Is(stopErr, context.Canceled) {
		return errors.Join(err, fmt.Errorf("stop job queue: %w", stopErr))
	}
	return err
}
