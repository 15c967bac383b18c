// Command scale measures the per-org costs of the worker as the orgs grow
// (internal/scale): for each count of -orgs it provisions that many orgs in a fresh
// database, times the flush ticks with -active orgs changing, and (with -close) the
// close scan and the close of every org's period; `make scale` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
	orgs := flag.String("orgs", "1000,10000", "comma-separated org counts, one run each")
	active := flag.Int("active", 100, "orgs with new usage before each measured flush tick")
	ticks := flag.Int("ticks", 5, "measured ticks of each kind")
	closeTo := flag.Int("close-max", 10_000, "also close every org's period in runs of at most this many orgs (0: never)")
	parallel := flag.Int("parallel", 4, "periods closed at once")
	provision := flag.Int("provision", 0, "only provision this many orgs in a new database, kept, print its URL and write the orgs' tokens (org and key per line) to -tokens: for load against a real api")
	tokens := flag.String("tokens", "scale-tokens.txt", "where -provision writes the tokens")
	flag.Parse()
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
	fmt.Printf("| orgs | provision | first flush (whole) | idle flush | flush, %d active | orgs visited | close scan | close every period | key+org lookup: cold / spread / over 10 (spread/10 ratio) | queries in the spread passes |\n", *active)
	fmt.Println("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, s := range strings.Split(*orgs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-orgs: %q is not a count", s)
		}
		r, err := scale.Run(ctx, scale.Config{DatabaseURL: db, RedisURL: rds, Orgs: n, Active: *active, Ticks: *ticks,
			Close: *closeTo > 0 && n <= *closeTo, Parallel: *parallel})
		if err != nil {
			return fmt.Errorf("%d orgs: %w", n, err)
		}
		closeCol, scanCol := "-", "-"
		if r.Closed > 0 {
			scanCol = fmt.Sprintf("%s (%d due)", ms(r.DueScan), r.Due)
			closeCol = fmt.Sprintf("%s (%.1f ms/org)", r.Close.Round(100*time.Millisecond), float64(r.Close.Microseconds())/1000/float64(r.Closed))
		}
		c := r.Cache
		fmt.Printf("| %d | %s | %s | %s | %s | %d | %s | %s | %s / %s / %s (%.2f) | %d |\n", n, r.Provision.Round(10*time.Millisecond), ms(r.FirstFlush),
			ms(r.IdleFlush), ms(r.ActiveFlush), r.ActiveVisited, scanCol, closeCol,
			c.FirstPass.Round(time.Microsecond/10), c.Spread.Round(time.Microsecond/10), c.Concentrated.Round(time.Microsecond/10),
			float64(c.Concentrated)/float64(c.Spread), c.SpreadQueries)
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
