// Command loadgen provisions orgs through a running Quotaplane api, drives
// /v1/check, /v1/check/batch or (-grpc) Envoy's ShouldRateLimit, or (-mode) checks
// of two metrics or acquire+release pairs of concurrency slots, and reports
// throughput, latency percentiles and whether any level admitted more than its limit;
// or (-mode rlqs) simulated Envoy proxies on the rate limit quota service beside
// ShouldRateLimit, per server message and per server core. Traffic goes only to the URL given;
// every run is bounded by -duration or -requests. An api that refuses the requests
// of a -mode (it lacks that part of the contract) exits with status 3, saying so.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/quotaplane/quotaplane/internal/loadgen"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		if refused := (*loadgen.RefusedError)(nil); errors.As(err, &refused) {
			fmt.Fprintln(os.Stderr, "loadgen: REFUSED:", err)
			os.Exit(exitRefused)
		}
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// exitRefused is the exit status of a run whose -mode the api does not take.
const exitRefused = 3

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	var cfg loadgen.Config
	fs.StringVar(&cfg.URL, "url", "http://127.0.0.1:8080", "api base URL")
	fs.StringVar(&cfg.AdminToken, "token", os.Getenv("QUOTA_ADMIN_TOKEN"), "operator token (default $QUOTA_ADMIN_TOKEN)")
	fs.StringVar(&cfg.Prefix, "prefix", fmt.Sprintf("lg%d", time.Now().Unix()), "id prefix; reuse one to reuse its orgs")
	fs.IntVar(&cfg.Orgs, "orgs", 10, "orgs to provision")
	fs.IntVar(&cfg.Teams, "teams", 2, "teams per org")
	fs.IntVar(&cfg.Users, "users", 5, "users per team")
	fs.Int64Var(&cfg.UserMonth, "user-month", 50, "month limit per user")
	fs.Int64Var(&cfg.TeamMonth, "team-month", 0, "month limit per team (default 80% of its users')")
	fs.Int64Var(&cfg.OrgMonth, "org-month", 0, "month limit per org (default 80% of its teams')")
	fs.Int64Var(&cfg.OrgPerMinute, "org-per-minute", 0, "per-minute limit per org (0: none)")
	fs.IntVar(&cfg.Concurrency, "c", 50, "concurrent connections")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to send (at most 10m)")
	fs.Int64Var(&cfg.Requests, "requests", 0, "stop after this many requests (0: duration only)")
	fs.Float64Var(&cfg.Rate, "rate", 0, "requests per second over all connections (0: as fast as possible)")
	fs.IntVar(&cfg.Batch, "batch", 0, "checks per request via /v1/check/batch (0: /v1/check)")
	fs.BoolVar(&cfg.GRPCPath, "grpc-path", false, "with -grpc: send Envoy's three descriptors of one path, [org], [org, team], [org, team, user], instead of one [team, user]")
	fs.StringVar(&cfg.GRPCAddr, "grpc", "", "send each check as Envoy's ShouldRateLimit to the api's gRPC rate limit service at this host:port (QUOTA_GRPC_ADDR) instead of /v1/check")
	fs.Float64Var(&cfg.HotShare, "hot", 0, "share of traffic sent to one hot org (0..1)")
	fs.StringVar(&cfg.Mode, "mode", loadgen.ModeCheck, "what one request is: check (one metric), multi (a check with costs of requests and -tokens), pairs (POST /v1/reservations of 1 unit of requests against concurrent limits, then DELETE it: one acquire+release pair), zipf (paths drawn by a Zipf law, by HTTP, the Go client, and the Go client with leases and batching: -duration each), rlqs (-proxies simulated Envoy proxies offering -rate in all over buckets ranked by the same law, then ShouldRateLimit as long; needs -grpc); give each mode its own -prefix")
	fs.Int64Var(&cfg.Tokens, "tokens", 1000, "-mode multi: tokens per check beside its requests; the tokens limits are the requests limits times this")
	fs.Int64Var(&cfg.OrgConcurrent, "org-concurrent", 8, "-mode pairs: concurrent limit of requests per org")
	fs.Int64Var(&cfg.TeamConcurrent, "team-concurrent", 5, "-mode pairs: concurrent limit of requests per team")
	fs.Int64Var(&cfg.UserConcurrent, "user-concurrent", 3, "-mode pairs: concurrent limit of requests per user")
	fs.DurationVar(&cfg.Hold, "hold", 0, "-mode pairs: how long each slot is held before its release")
	zipfS := fs.Float64("zipf-s", loadgen.DefaultZipfS, "-mode zipf: the Zipf law's exponent (> 1) over every org x team x user; -mode rlqs: over each proxy's buckets")
	zipfBatch := fs.Duration("zipf-batch", loadgen.DefaultZipfBatch, "-mode zipf: the batching wait of the leasing Go client")
	var rc loadgen.RLQSConfig
	fs.IntVar(&rc.Proxies, "proxies", 4, "-mode rlqs: simulated Envoy proxies on the rate limit quota service (needs -grpc)")
	fs.IntVar(&rc.Buckets, "buckets", 100, "-mode rlqs: buckets each proxy watches, its org's users")
	fs.DurationVar(&rc.Interval, "report-interval", time.Second, "-mode rlqs: each proxy's reporting interval")
	fs.StringVar(&rc.MetricsURL, "metrics-url", "", "-mode rlqs: the api's /metrics (QUOTA_METRICS_ADDR), for its CPU seconds in each phase")
	jsonOut := fs.String("json", "", "write the report as JSON to this file")
	htmlOut := fs.String("html", "", "write an HTML latency chart to this file")
	resp := fs.Int("resp", 0, "write this many check.lua EVALSHAs, as the engine builds them (org -prefix, 3 levels x month + minute, 1,000 users), in the Redis protocol to stdout for redis-cli --pipe, and exit: Redis's own ceiling for the script")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *resp > 0 {
		return writeRESP(os.Stdout, *resp, cfg.Prefix)
	}
	if cfg.Duration > 10*time.Minute {
		return errors.New("-duration: at most 10m")
	}
	if cfg.Mode == loadgen.ModeZipf {
		return runZipf(ctx, fs, cfg, *zipfS, *zipfBatch, *jsonOut)
	}
	cfg.Progress = os.Stderr
	fmt.Fprintf(os.Stderr, "provisioning %d orgs x %d teams through %s...\n", cfg.Orgs, cfg.Teams, cfg.URL)
	orgs, err := loadgen.Provision(ctx, cfg)
	if err != nil {
		return err
	}
	if cfg.Mode == loadgen.ModeRLQS {
		fmt.Fprintf(os.Stderr, "%d proxies for %v, then ShouldRateLimit at %d connections as long...\n", rc.Proxies, cfg.Duration, cfg.Concurrency)
		rc.Zipf = *zipfS
		rep, err := loadgen.RunRLQS(ctx, cfg, rc, orgs)
		rep.Text(os.Stdout)
		if err == nil && *jsonOut != "" {
			b, _ := json.MarshalIndent(rep, "", "  ")
			err = os.WriteFile(*jsonOut, b, 0o644)
		}
		return err
	}
	fmt.Fprintf(os.Stderr, "sending for %v at %d connections...\n", cfg.Duration, cfg.Concurrency)
	rep, err := loadgen.Run(ctx, cfg, orgs)
	refused := (*loadgen.RefusedError)(nil)
	if err != nil && !errors.As(err, &refused) {
		return err
	}
	rep.Text(os.Stdout) // a refused run's says so; it is written out too, and exits exitRefused
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	if *htmlOut != "" {
		f, err := os.Create(*htmlOut)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := rep.HTML(f); err != nil {
			return err
		}
	}
	if refused != nil {
		return refused
	}
	if !rep.Verified {
		return errors.New("over-admission detected")
	}
	return nil
}

// runZipf provisions and runs -mode zipf: one org of one team of 100,000 users, limits
// far away (unless flags say otherwise), three phases of -duration each.
func runZipf(ctx context.Context, fs *flag.FlagSet, cfg loadgen.Config, s float64, batch time.Duration, jsonOut string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for flag, set := range map[string]func(){ // unless the flag is given
		"users": func() { cfg.Users = 100_000 }, "orgs": func() { cfg.Orgs = 1 }, "teams": func() { cfg.Teams = 1 },
		"user-month": func() { cfg.UserMonth = 1_000_000_000 }, "team-month": func() { cfg.TeamMonth = 100_000_000_000_000 },
		"org-month": func() { cfg.OrgMonth = 100_000_000_000_000 },
	} {
		if !given[flag] {
			set()
		}
	}
	cfg.Progress = os.Stderr
	fmt.Fprintf(os.Stderr, "provisioning %d orgs x %d teams (%d users each) through %s...\n", cfg.Orgs, cfg.Teams, cfg.Users, cfg.URL)
	orgs, err := loadgen.Provision(ctx, cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "zipf: three phases of %v at %d workers...\n", cfg.Duration, cfg.Concurrency)
	rep, err := loadgen.RunZipf(ctx, cfg, orgs, s, batch)
	if err != nil {
		return err
	}
	rep.Text(os.Stdout)
	if jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	if !rep.Verified {
		return errors.New("over-admission detected")
	}
	return nil
}

// writeRESP writes n EVALSHAs of check.lua for org in the Redis protocol, built as the
// engine builds them now, with the limits of make bench's wrk runs (never reached).
// The stream starts with SCRIPT LOAD of the script, byte for byte, so it runs on a
// Redis that has never seen the script (a body loaded by other means, e.g. through a
// shell's "$(cat ...)", which drops the last newline, has another sha).
func writeRESP(out io.Writer, n int, org string) error {
	w := bufio.NewWriterSize(out, 1<<16)
	if err := writeCommand(w, []any{"script", "load", quota.CheckScript()}); err != nil {
		return err
	}
	lim := func(v int64) []vocab.Limit {
		return []vocab.Limit{{Window: vocab.Month, Limit: v}, {Window: vocab.Minute, Limit: v}}
	}
	now := time.Now()
	for i := range n {
		req := quota.Request{Org: org, Team: "eng", User: "u" + strconv.Itoa(i%1000), Metric: "requests", Cost: 1,
			Limits: quota.LevelLimits{Org: lim(1_000_000_000_000), Team: lim(500_000_000_000), User: lim(250_000_000_000)}}
		args, err := quota.CheckCommand("q", req, now)
		if err != nil {
			return err
		}
		if err := writeCommand(w, args); err != nil {
			return err
		}
	}
	return w.Flush()
}

// writeCommand writes one command in the Redis protocol.
func writeCommand(w *bufio.Writer, args []any) error {
	fmt.Fprintf(w, "*%d\r\n", len(args))
	for _, a := range args {
		var s string
		switch v := a.(type) {
		case string:
			s = v
		case []byte:
			s = string(v)
		case int:
			s = strconv.Itoa(v)
		case int64:
			s = strconv.FormatInt(v, 10)
		default:
			return fmt.Errorf("resp: argument of type %T", a)
		}
		fmt.Fprintf(w, "$%d\r\n%s\r\n", len(s), s)
	}
	return nil
}
