// Command quotaplane-api serves the Quotaplane HTTP API, and Envoy's rate limit
// service and rate limit quota service over gRPC on QUOTA_GRPC_ADDR. `quotaplane-api demo`
// instead migrates the database, seeds the demo org and prints how to use it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/checks"
	"github.com/quotaplane/quotaplane/internal/config"
	"github.com/quotaplane/quotaplane/internal/console"
	"github.com/quotaplane/quotaplane/internal/demo"
	"github.com/quotaplane/quotaplane/internal/httpapi"
	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/platform/faultclock"
	"github.com/quotaplane/quotaplane/internal/platform/healthcheck"
	"github.com/quotaplane/quotaplane/internal/platform/pgdb"
	"github.com/quotaplane/quotaplane/internal/platform/redact"
	"github.com/quotaplane/quotaplane/internal/platform/redisconn"
	"github.com/quotaplane/quotaplane/internal/platform/tracing"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/rls"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/web"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "healthcheck" { // docker-compose.yml's healthcheck
		if err := healthcheck.Run(ctx, os.Args[2:], "http://127.0.0.1:8080/healthz"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		// JSON like every other line, so a log pipeline reads why the api stopped.
		slog.New(slog.NewJSONHandler(os.Stderr, nil)).Error("quotaplane-api stopped", "err", err.Error())
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := config.LoadAPI(getenv)
	if err != nil {
		return fmt.Errorf("configuration:\n%w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	redisconn.LogTo(log)
	if len(args) > 0 && args[0] != "demo" {
		return fmt.Errorf("unknown command %q (commands: demo, healthcheck [url]; none serves the API)", args[0])
	}
	serving := len(args) == 0
	// Bind before anything slow, so a busy address fails at once and "listening" is
	// logged only once it is true.
	var ln, pprofLn, grpcLn, metricsLn net.Listener
	if serving {
		if ln, err = config.Listen("QUOTA_HTTP_ADDR", cfg.HTTPAddr); err != nil {
			return err
		}
		defer ln.Close()
		if cfg.GRPCAddr != "" {
			if grpcLn, err = config.Listen("QUOTA_GRPC_ADDR", cfg.GRPCAddr); err != nil {
				return err
			}
			defer grpcLn.Close()
		}
		if cfg.PprofAddr != "" {
			if pprofLn, err = config.Listen("QUOTA_PPROF_ADDR", cfg.PprofAddr); err != nil {
				return err
			}
			defer pprofLn.Close()
		}
		if cfg.MetricsAddr != "" {
			// A busy address stops the api like any other, unless it is the default
			// (QUOTA_METRICS_ADDR unset): then a second api on the machine (tests, a
			// second make run) serves no metrics and says so, rather than not start.
			switch metricsLn, err = config.Listen("QUOTA_METRICS_ADDR", cfg.MetricsAddr); {
			case err == nil:
				defer metricsLn.Close()
			case getenv("QUOTA_METRICS_ADDR") == "":
				log.Warn("not serving /metrics: its default address is busy; set QUOTA_METRICS_ADDR", "addr", cfg.MetricsAddr, "err", err.Error())
			default:
				return err
			}
		}
	}

	// Spans are exported when OTEL_EXPORTER_OTLP_ENDPOINT is set; the last ones are
	// flushed once everything that makes them has stopped (deferred first, runs last).
	tp, stopTracing, err := tracing.Start(ctx, tracing.APIService, getenv, log)
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
	if !serving {
		svc := tenants.NewService(pool, tenants.WithPasswordHashes(cfg.PasswordHashes))
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		stateDir := fs.String("state-dir", ".quotaplane", "where the demo key and console password are kept")
		hide := fs.Bool("hide-secrets", false, "print where the demo key and console password are kept, not them (logs are no place for secrets)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		res, err := demo.Seed(ctx, svc, *stateDir)
		if err != nil {
			return err
		}
		if *hide {
			printDemoHidden(stdout, cfg, res, *stateDir)
			return nil
		}
		printDemo(stdout, cfg, res)
		return nil
	}

	log.Info("starting quotaplane-api", "config", cfg)
	rdb, err := redisconn.New(cfg.RedisURL, cfg.RedisCluster)
	if err != nil {
		return err
	}
	defer rdb.Close()
	if err := rdb.Ping(startCtx).Err(); err != nil {
		log.Warn("cannot reach Redis; /readyz reports it until it answers", "url", redact.URL(cfg.RedisURL), "err", err.Error())
	}
	if cfg.AdminToken == "" {
		log.Warn("QUOTA_ADMIN_TOKEN is not set: the operator API (plans, orgs) is disabled")
	}
	// Checks go to the org's dedicated Redis or its plan's pool, each behind a
	// circuit breaker; engine clients never retry (a retried script after a lost
	// reply would count a check twice).
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector()) // go_build_info: which build each replica runs
	// The ledger the worker keeps: it refills a Redis that lost its counters.
	usage := billing.NewStore(pool)
	cacheMetrics := cachemetrics.New(registry)
	engine := quota.Config{KeyPrefix: cfg.RedisPrefix, Hydrator: usage.Ledger(), KeyCache: cacheMetrics.For("engine_keys"), TracerProvider: tp,
		Leases:             quota.LeaseConfig{Enabled: cfg.Leases, Max: cfg.LeaseMax},
		IdempotencyRecords: cfg.IdempotencyRecords, UnregisteredUsers: cfg.UnregisteredUsers} // the org's bounds on Redis
	// A test hook, off by default: QUOTA_FAULT_CLOCK=on lets SIGUSR1/SIGUSR2 step the
	// engines' wall clock by +-2 s, which must change no decision.
	if cfg.FaultClock {
		fc := quota.NewStepClock()
		fc.Use(&engine)
		faultclock.Install(ctx, fc, log)
	}
	router, err := quota.NewEngines(quota.EnginesConfig{DefaultURL: redisconn.Canonical(cfg.RedisURL, cfg.RedisCluster), Pools: cfg.RedisPools,
		MaxInFlightPerOrg: cfg.MaxInFlightPerOrg, Replicas: cfg.Replicas, RedisTimeout: cfg.RedisTimeout,
		MetricsOrgs: quota.MetricsOrgs(cfg.MetricsOrgs),
		Registerer:  registry, Engine: engine})
	if err != nil {
		return err
	}
	defer router.Close()
	// Grants lapse, and the usage API's current period turns, on the engines' clock
	// (Redis time on the monotonic clock), as checks count: a stepped local clock moves
	// neither.
	// Password hashes run a few at a time (19 MiB each), and an org holds a bounded
	// number of keys.
	svc := tenants.NewService(pool, tenants.WithClock(router.DefaultNow), tenants.WithPasswordHashes(cfg.PasswordHashes),
		tenants.WithMaxKeysPerOrg(cfg.MaxKeysPerOrg))
	// Keys' last_used_at, off the check path: noted when authenticated, written in batches.
	go svc.RecordKeyUses(ctx, 30*time.Second)
	// Resolved orgs and keys are cached; changes reach every replica through Redis pub/sub.
	cache := tenants.NewCache(svc, tenants.CacheOptions{Logger: log, Metrics: cacheMetrics, Channel: tenants.ChannelFor(cfg.RedisPrefix),
		Orgs: cfg.CacheOrgs, Users: cfg.CacheUsers, Keys: cfg.CacheKeys, Memory: int64(cfg.CacheMemoryMB) << 20})
	cache.Listen(ctx, rdb)
	// Keys in use are revalidated in batches before their TTL ends, off the check path.
	go cache.RefreshKeys(ctx, time.Second)
	// Which RateLimit header fields answers carry (validated by config).
	headerMode, err := checks.ParseHeaderMode(cfg.RateLimitHeaders)
	if err != nil {
		return fmt.Errorf("QUOTA_RATELIMIT_HEADERS: %w", err)
	}
	// The web console at /console/, signed in with console users' sessions.
	// Sign-ins are limited per address, per address and email, and in all, before any
	// password is hashed; behind TLS-terminating proxies the cookie is still Secure.
	consoleHandler := console.NewHandler(console.NewSessions(pool, svc, console.Options{SignIn: console.Limits{
		Global: cfg.SignInRate, GlobalWindow: cfg.SignInWindow, PerIP: cfg.SignInIPRate, IPWindow: cfg.SignInIPWindow}}),
		web.Dist(), log, console.HandlerOptions{Proxies: cfg.TrustedProxies, SecureCookies: cfg.ConsoleSecureCookies})
	handler, err := httpapi.NewHandler(httpapi.Deps{Tenants: svc, Cache: cache, Checker: router, Registry: registry, Redis: rdb,
		AdminToken: cfg.AdminToken, Logger: log, Console: consoleHandler,
		AdminRateLimit: cfg.AdminRateLimit, AdminRateWindow: cfg.AdminRateWindow, TracerProvider: tp, RateLimitHeaders: headerMode,
		AdminOrgRateLimit: cfg.AdminOrgRateLimit, AdminOrgRateWindow: cfg.AdminOrgRateWindow, ServeMetrics: cfg.MetricsPublic,
		Billing:  &billing.Service{Store: usage, Tenants: svc, Clock: router.DefaultNow, Logger: log, Counters: ledger.EngineCounters(router)},
		Webhooks: &webhooks.Service{Store: webhooks.NewStore(pool), Tenants: svc, Secret: []byte(cfg.WebhookSecret), Client: webhooks.NewClient(10*time.Second, cfg.WebhookAllowPrivate)}})
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second}
	errc := make(chan error, 4) // the api, the gRPC, the pprof and the metrics listener
	if metricsLn != nil {
		// /metrics on its own listener (loopback by default): the metrics name orgs and
		// their traffic, which the public listener does not show.
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", httpapi.MetricsHandler(registry))
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		defer msrv.Close()
		go func() { errc <- fmt.Errorf("metrics on %s: %w", metricsLn.Addr(), msrv.Serve(metricsLn)) }()
		log.Info("serving metrics", "addr", "http://"+metricsLn.Addr().String()+"/metrics")
	}
	if cfg.PprofAddr != "" {
		// Opt-in profiling on its own loopback listener, never on the API's.
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		psrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		defer psrv.Close()
		go func() { errc <- fmt.Errorf("pprof on %s: %w", pprofLn.Addr(), psrv.Serve(pprofLn)) }()
		log.Info("serving pprof", "addr", "http://"+pprofLn.Addr().String()+"/debug/pprof/")
	}
	// Envoy's rate limit service, on its own listener, over the same cache and engine.
	var gsrv *grpc.Server
	var ghealth *health.Server
	if grpcLn != nil {
		// TLS, streams per connection, the keepalive policy
		gopts, err := rls.ServerOptions(rls.Limits{CertFile: cfg.GRPCTLSCert, KeyFile: cfg.GRPCTLSKey,
			MaxStreams: uint32(cfg.GRPCMaxStreams), KeepaliveMinTime: cfg.GRPCKeepaliveMinTime, StreamWorkers: cfg.GRPCStreamWorkers,
			HandshakeTimeout: cfg.GRPCHandshakeTimeout})
		if err != nil {
			return fmt.Errorf("QUOTA_GRPC_TLS_CERT: %w", err)
		}
		gsrv, ghealth = rls.NewServer(rls.Deps{Cache: cache, Checker: router, Aliases: cfg.GRPCAliases, Logger: log, RateLimitHeaders: headerMode,
			Registerer: registry, TracerProvider: tp, RLQS: rls.RLQSLimits{AssignmentLife: cfg.RLQSAssignmentLife,
				MaxBuckets: cfg.RLQSMaxBuckets, IdleTimeout: cfg.RLQSIdleTimeout, ReportLag: cfg.RLQSReportLag}}, gopts...)
		defer gsrv.Stop()
		go func() { errc <- fmt.Errorf("serve gRPC on %s: %w", grpcLn.Addr(), gsrv.Serve(grpcLn)) }()
		log.Info("serving Envoy's rate limit service and rate limit quota service", "addr", grpcLn.Addr().String())
	}
	go func() { errc <- fmt.Errorf("serve on %s: %w", ln.Addr(), srv.Serve(ln)) }()
	log.Info("listening", "addr", "http://"+ln.Addr().String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: draining requests")
	shutCtx, cancelShut := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelShut()
	// Both servers drain at once: health says NOT_SERVING, then in-flight calls finish
	// (or are cut when the HTTP drain gives up).
	grpcDone := make(chan struct{})
	go func() {
		defer close(grpcDone)
		if gsrv != nil {
			ghealth.Shutdown()
			gsrv.GracefulStop()
		}
	}()
	err = srv.Shutdown(shutCtx)
	select {
	case <-grpcDone:
	case <-shutCtx.Done():
		if gsrv != nil {
			gsrv.Stop()
		}
		<-grpcDone
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

func printDemo(w io.Writer, cfg config.API, res demo.Result) {
	base := reachableURL(cfg.HTTPAddr)
	token := cfg.AdminToken
	if token == "" {
		token = "(QUOTA_ADMIN_TOKEN is not set: the operator API is disabled)"
	}
	// The sign-in names the org (console emails are unique per org only): the URL
	// fills it in.
	console := fmt.Sprintf("%s/console/?org=%s  (sign in as %s / %s)", base, demo.OrgID, res.ConsoleEmail, res.ConsolePassword)
	if res.ConsolePassword == "" {
		console = fmt.Sprintf("%s/console/?org=%s  (as %s: %s)", base, demo.OrgID, res.ConsoleEmail, res.ConsoleNote)
	}
	fmt.Fprintf(w, `
Quotaplane demo is ready (org %q, plan %q, teams eng and sales, users alice and bob).

  API:             %s
  Operator token:  %s
  Demo org key:    %s
  Console:         %s

Try it:
  curl -s -H "Authorization: Bearer %s" %s/v1/orgs/%s/teams
  curl -s -H "Authorization: Bearer %s" %s/v1/plans

`, demo.OrgID, demo.PlanID, base, token, res.OrgKey, console,
		res.OrgKey, base, demo.OrgID, cfg.AdminToken, base)
}

// printDemoHidden is printDemo without a secret: docker compose keeps a service's
// output in its logs, so the seed says where the key and the console password are
// (stateDir, a volume) and how to read them, and never prints the operator token.
func printDemoHidden(w io.Writer, cfg config.API, res demo.Result, stateDir string) {
	base := reachableURL(cfg.HTTPAddr)
	fmt.Fprintf(w, `
Quotaplane demo is ready (org %q, plan %q, teams eng and sales, users alice and bob).

  API:             %s
  Operator token:  your QUOTA_ADMIN_TOKEN
  Demo org key:    in %s/demo-org-key
  Console:         %s/console/?org=%s  (sign in as %s, password in %s/demo-console-password)

Read them (docker compose; the files stay in the seed volume):
  docker cp "$(docker compose ps -aq seed)":%s/demo-org-key - | tar -xO
  docker cp "$(docker compose ps -aq seed)":%s/demo-console-password - | tar -xO

`, demo.OrgID, demo.PlanID, base, stateDir, base, demo.OrgID, res.ConsoleEmail, stateDir, stateDir, stateDir)
}

// reachableURL is the URL a person on this machine opens for a listen address: a
// wildcard host (0.0.0.0, ::, none) is listened on by every address, and is itself
// no place to send a request to.
func reachableURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "http://" + addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
