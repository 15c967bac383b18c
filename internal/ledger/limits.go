package ledger

import (
	"context"
	"fmt"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/quotaplane/quotaplane/internal/platform/cachemetrics"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// Limits is what the worker knows of an org's limits: the org's effective ones,
// its teams (own limits and user defaults) and its registered users' own limits.
// The flusher's threshold events and billing's close and usage reads use it.
type Limits struct {
	Org   tenants.Org
	Teams map[string]tenants.Team
	Users map[string]tenants.User // registered users by id
}

// LoadLimits reads an org with its teams and registered users (with the org when it
// has at most tenants.DefaultMaxOrgUsers, else a page of 1000 users per query).
func LoadLimits(ctx context.Context, svc *tenants.Service, orgID string) (*Limits, error) {
	r, err := svc.ResolveOrg(ctx, orgID)
	if err != nil {
		return nil, fmt.Errorf("limits of org %q: %w", orgID, err)
	}
	out := &Limits{Org: r.Org, Teams: r.Teams, Users: map[string]tenants.User{}}
	if r.UsersComplete { // the registered users came with the org: no more queries
		for id, u := range r.Users {
			out.Users[id] = tenants.User{OrgID: orgID, TeamID: u.TeamID, ID: id, Limits: u.Limits}
		}
		return out, nil
	}
	for teamID := range r.Teams {
		cursor := ""
		for {
			us, next, err := svc.ListUsers(ctx, orgID, teamID, tenants.Page{Limit: 1000, Cursor: cursor})
			if err != nil {
				return nil, fmt.Errorf("limits of org %q: %w", orgID, err)
			}
			for _, u := range us {
				out.Users[u.ID] = u
			}
			if cursor = next; cursor == "" {
				break
			}
		}
	}
	return out, nil
}

// Of returns the effective limits of a counter's level for its metric, every window.
func (o *Limits) Of(c quota.Counter) []vocab.Limit {
	var ls []vocab.Limit
	switch c.Level {
	case vocab.LevelOrg:
		ls = o.Org.EffectiveLimits
	case vocab.LevelTeam:
		ls = o.Teams[c.Team].Limits
	case vocab.LevelUser:
		t, ok := o.Teams[c.Team]
		if !ok {
			return nil
		}
		ls = t.UserLimits
		if u, ok := o.Users[c.User]; ok && u.TeamID == c.Team {
			ls = tenants.MergeLimits(t.UserLimits, u.Limits)
		}
	}
	var out []vocab.Limit
	for _, l := range ls {
		if l.Metric == c.Metric {
			out = append(out, l)
		}
	}
	return out
}

// Month returns the month limit of a counter, and whether it has one.
func (o *Limits) Month(c quota.Counter) (int64, bool) {
	for _, l := range o.Of(c) {
		if l.Window == vocab.Month {
			return l.Limit, true
		}
	}
	return 0, false
}

// limitCache keeps each org's limits for a while, so the flusher does not read the
// tenancy tables on every tick: an LRU of a bounded number of orgs (QUOTA_CACHE_ORGS),
// whose entries are read again after ttl.
type limitCache struct {
	svc     *tenants.Service
	ttl     time.Duration
	entries *lru.Cache[string, limitEntry]
	m       cachemetrics.Hooks
}

type limitEntry struct {
	l  *Limits
	at time.Time
}

func newLimitCache(svc *tenants.Service, ttl time.Duration, size int, m cachemetrics.Hooks) *limitCache {
	entries, err := lru.New[string, limitEntry](size)
	if err != nil {
		panic(err) // size <= 0: NewFlusher sets a default
	}
	return &limitCache{svc: svc, ttl: ttl, entries: entries, m: m.OrNop()}
}

func (c *limitCache) get(ctx context.Context, org string) (*Limits, error) {
	if e, ok := c.entries.Get(org); ok && time.Since(e.at) < c.ttl {
		c.m.Hit()
		return e.l, nil
	}
	c.m.Miss()
	l, err := LoadLimits(ctx, c.svc, org)
	if err != nil {
		return nil, err
	}
	if c.entries.Add(org, limitEntry{l: l, at: time.Now()}) {
		c.m.Evict()
	}
	return l, nil
}
