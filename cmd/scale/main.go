// Command scale measures the per-org costs of the worker as the orgs grow
// (internal/scale): for each count of -orgs it provisions that many orgs in a fresh
// database and prints, each against its bound, the writes of a tick with -active orgs
// changed and whether the ledger then equals the counters, a restarted worker's first
// flush (after a kill with -inflight orgs drained and not written, and with nothing in
// flight), idle ticks, and (with -close) the close scan and the close of every org's
// period; it exits 1 when a figure is out of its bound. `make scale` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/scale"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	orgs := flag.String("orgs", "100000", "comma-separated org counts, one run each")
	active := flag.Int("active", 0, "orgs with new usage before the measured active tick (0: every org)")
	inflight := flag.Int("inflight", 1000, "orgs a killed worker had drained and not written")
	ticks := flag.Int("ticks", 5, "measured idle ticks")
	closeTo := flag.Int("close-max", 10_000, "also close every org's period in runs of at most this many orgs (0: never)")
	parallel := flag.Int("parallel", 4, "periods closed at once")
	provision := flag.Int("provision", 0, "only provision this many orgs in a new database, kept, print its URL and write the orgs' tokens (org and key per line) to -tokens: for load against a real api")
	tokens := flag.String("tokens", "scale-tokens.txt", "where -provision writes the tokens")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		out, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	db, rds := os.Getenv("DATABASE_URL"), os.Getenv("REDIS_URL")
	if db == "" || rds == "" {
		return fmt.Errorf("DATABASE_URL and REDIS_URL must be set")
	}
	if *provision > 0 {
		u, err := scale.ProvisionDatabase(ctx, db, *provision)
		if err != nil {
			return err
		}
		var b strings.Builder
		for i := range *provision {
			fmt.Fprintf(&b, "%s %s\n", scale.OrgID(i), scale.Token(i))
		}
		if err := os.WriteFile(*tokens, []byte(b.String()), 0o600); err != nil {
			return err
		}
		fmt.Println(u)
		return nil
	}
	failed := false
	for _, s := range strings.Split(*orgs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-orgs: %q is not a count", s)
		}
		r, err := scale.Run(ctx, scale.Config{DatabaseURL: db, RedisURL: rds, Orgs: n, Active: *active, InFlight: *inflight,
			Ticks: *ticks, Close: *closeTo > 0 && n <= *closeTo, Parallel: *parallel})
		if err != nil {
			return fmt.Errorf("%d orgs: %w", n, err)
		}
		if !report(os.Stdout, r) {
			failed = true
		}
	}
	if failed {
		return fmt.Errorf("a figure is out of its bound (FAIL above)")
	}
	return nil
}

// report prints one run's figures, each with its bound where it has one (the issue's
// and docs/SCALING.md's), and says whether all held.
func report(w io.Writer, r scale.Result) bool {
	ok := true
	line := func(what, figure string, pass bool, bound string) {
		verdict := ""
		if bound != "" {
			verdict = "PASS"
			if !pass {
				verdict, ok = "FAIL", false
			}
			verdict = fmt.Sprintf("  (bound %s) %s", bound, verdict)
		}
		fmt.Fprintf(w, "  %-52s %s%s\n", what, figure, verdict)
	}
	fmt.Fprintf(w, "%d orgs, a plan, 5 teams and a key each, flush interval 2 s\n", r.Orgs)
	line("provisioned in", r.Provision.Round(10*time.Millisecond).String(), true, "")
	line(fmt.Sprintf("persisting %d active orgs (one tick's writes)", r.Active),
		fmt.Sprintf("%s (%d orgs visited, %d counters; the whole tick with its threshold checks %s)", ms(r.ActivePersist),
			r.ActiveVisited, r.ActiveRead, ms(r.ActiveTick)), r.ActivePersist <= 2*time.Second, "2 s")
	line("  its batches' Redis reads / Postgres writes (summed)", fmt.Sprintf("%s / %s; Redis ran scripts %s (%.1f µs an org; a check %.1f µs)",
		ms(r.ActiveDraining), ms(r.ActiveWriting), ms(r.ActiveRedis), float64(r.ActiveRedis.Microseconds())/float64(max(r.ActiveVisited, 1)),
		float64(r.CheckRedis.Nanoseconds())/1000), true, "")
	line("ledger equals the counters, every counter", fmt.Sprintf("%d of %d orgs", r.LedgerEqual, r.Active), r.LedgerEqual == r.Active, "all")
	line("memory per org: Redis / the ledger in Postgres", fmt.Sprintf("%d bytes / %d bytes (%.1f rows: usage_counters and usage_daily, indexes included)",
		r.RedisBytes, r.LedgerBytes, r.LedgerRows), true, "")
	line(fmt.Sprintf("first flush after a kill, %d orgs in flight", r.InFlight),
		fmt.Sprintf("%s (%d read whole, %d stored equal to Redis)", ms(r.Recovery), r.Recovered, r.RecoveredEqual),
		r.Recovered >= r.InFlight && r.RecoveredEqual == r.InFlight, "every one recovered")
	line(fmt.Sprintf("first flush over %d idle orgs, nothing in flight", r.Orgs),
		fmt.Sprintf("%s (%d orgs visited)", ms(r.FirstFlush), r.FirstVisited), r.FirstFlush <= 5*time.Second, "5 s")
	line("ticks until a restart's utilization scan was done", fmt.Sprint(r.AfterTicks), true, "")
	line("idle tick (average)", ms(r.IdleFlush), r.IdleFlush < 50*time.Millisecond, "50 ms")
	if r.Closed > 0 {
		line("close scan", fmt.Sprintf("%s (%d due)", ms(r.DueScan), r.Due), true, "")
		line("close every period", fmt.Sprintf("%s (%.1f ms/org)", r.Close.Round(100*time.Millisecond),
			float64(r.Close.Microseconds())/1000/float64(r.Closed)), true, "")
	}
	c := r.Cache
	line("key+org lookup in-process: cold / spread / over 10", fmt.Sprintf("%s / %s / %s (spread/10 %.2f; %d queries in the spread passes)",
		c.FirstPass.Round(time.Microsecond/10), c.Spread.Round(time.Microsecond/10), c.Concentrated.Round(time.Microsecond/10),
		float64(c.Concentrated)/float64(c.Spread), c.SpreadQueries), true, "")
	return ok
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
