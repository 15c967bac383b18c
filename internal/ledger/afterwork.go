package ledger

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// afterWork is what a tick does after its writes, in the time left of it: the
// threshold checks of the counters written (one per org and period, the latest values
// kept while it waits), and the reads of orgs' stored utilization of their current
// period for quotaplane_worker_month_utilization_ratio (the orgs visited, every
// UtilizationEvery, and once after start every org, page by page). Both read each
// org's limits, from the limit cache or Postgres: with more orgs active than the cache
// holds that costs a query per org, and what does not fit in a tick waits, in order,
// for the next one. A tick's batches queue checks at once (check); the rest is the
// tick's own goroutine's, after its batches.
type afterWork struct {
	mu     sync.Mutex               // check, against the other batches
	checks map[string]*pendingCheck // org|period
	order  []string                 // checks, oldest first
	util   map[string]tenants.Org   // orgs whose stored utilization to read
	scan   bool                     // the scan of every org's stored utilization is running
	cursor string                   // where the scan goes on
}

type pendingCheck struct {
	org, period string
	end         time.Time
	counters    map[quota.Counter]int64
}

func newAfterWork() afterWork {
	return afterWork{checks: map[string]*pendingCheck{}, util: map[string]tenants.Org{}}
}

// check queues the threshold check of counters written for org's period; a check
// still queued for it takes the higher values.
func (a *afterWork) check(org, period string, end time.Time, counters map[quota.Counter]int64) {
	if len(counters) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	key := org + "|" + period
	if p, ok := a.checks[key]; ok {
		for c, v := range counters {
			p.counters[c] = max(p.counters[c], v)
		}
		return
	}
	cs := make(map[quota.Counter]int64, len(counters))
	for c, v := range counters {
		cs[c] = v
	}
	a.checks[key] = &pendingCheck{org: org, period: period, end: end, counters: cs}
	a.order = append(a.order, key)
}

// readUtilization queues the stored utilization of orgs, and with all the scan of
// every org.
func (a *afterWork) readUtilization(orgs []tenants.Org, all bool) {
	for _, o := range orgs {
		a.util[o.ID] = o
	}
	if all {
		a.scan, a.cursor = true, ""
	}
}

func (a *afterWork) pending() int {
	n := len(a.order) + len(a.util)
	if a.scan {
		n++
	}
	return n
}

// utilPage bounds the orgs of one read of stored utilization.
const utilPage = 1000

// runAfter does the after-work until deadline (at least one step), and returns how
// much is left. Its errors are logged: the work stays queued.
func (f *Flusher) runAfter(ctx context.Context, deadline time.Time, now time.Time) int {
	a := &f.after
	for ctx.Err() == nil {
		switch {
		case len(a.order) > 0:
			key := a.order[0]
			p := a.checks[key]
			err := f.notifier.check(ctx, p.org, p.period, p.end, p.counters)
			a.mu.Lock()
			a.order = a.order[1:]
			delete(a.checks, key)
			a.mu.Unlock()
			if err != nil {
				// Judged again when its counters next change; the rest waits for the
				// next tick, so an outage costs one warning a tick, not one per org.
				f.cfg.Logger.Warn("threshold events", "org", p.org, "period", p.period, "err", err.Error())
				return a.pending()
			}
		case len(a.util) > 0:
			page := make([]tenants.Org, 0, utilPage)
			for _, o := range a.util {
				if page = append(page, o); len(page) == utilPage {
					break
				}
			}
			done, err := f.storedUtilization(ctx, page, now, deadline)
			for _, id := range done {
				delete(a.util, id)
			}
			if err != nil {
				f.cfg.Logger.Warn("month utilization from the ledger", "err", err.Error())
				return a.pending()
			}
		case a.scan:
			page, next, err := f.cfg.Tenants.ListOrgs(ctx, tenants.Page{Limit: utilPage, Cursor: a.cursor})
			if err != nil {
				f.cfg.Logger.Warn("month utilization from the ledger", "err", err.Error())
				return a.pending()
			}
			a.readUtilization(page, false)
			a.cursor, a.scan = next, next != ""
		default:
			return 0
		}
		if time.Now().After(deadline) {
			break
		}
	}
	return a.pending()
}

// storedUtilization records, for quotaplane_worker_month_utilization_ratio, each
// stored counter of orgs' current periods against its month limit: durable data, so
// an org at 100 % whose counters no longer change (only denials), or that Redis lost,
// is exported by a worker that has just started. One query for the page's usage, then
// the limits of each org that has any, until deadline; it returns the orgs done.
func (f *Flusher) storedUtilization(ctx context.Context, orgs []tenants.Org, now, deadline time.Time) ([]string, error) {
	ps := make([]quota.OrgPeriod, len(orgs))
	ends := make(map[string]time.Time, len(orgs))
	for i, o := range orgs {
		cur := vocab.PeriodAt(now, o.BillingAnchorDay)
		ps[i] = quota.OrgPeriod{Org: o.ID, Period: cur.ID}
		ends[o.ID] = cur.End
	}
	used, err := f.cfg.Store.UsageMany(ctx, ps)
	if err != nil {
		return nil, err
	}
	done := make([]string, 0, len(orgs))
	for i, p := range ps {
		if i > 0 && time.Now().After(deadline) {
			return done, nil
		}
		if counters := used[p]; len(counters) > 0 {
			l, err := f.notifier.limits.get(ctx, p.Org)
			if errors.Is(err, derrors.NotFound) {
				done = append(done, p.Org) // deleted since: nothing to export
				continue
			}
			if err != nil {
				return done, err
			}
			for c, v := range counters {
				if limit, ok := l.Month(c); ok && limit > 0 {
					f.notifier.util.observe(p.Org, p.Period, ends[p.Org], string(c.Level), c.Metric, float64(v)/float64(limit))
				}
			}
		}
		done = append(done, p.Org)
	}
	return done, nil
}
