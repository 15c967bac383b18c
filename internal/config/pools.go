package config

import (
	"errors"
	"fmt"
	"strings"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/platform/redact"
	"github.com/quotaplane/quotaplane/internal/platform/redisconn"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// ErrInvalid is wrapped by every error of ParsePools: a QUOTA_REDIS_POOLS value it
// refuses. Its kind is derrors.Invalid.
var ErrInvalid = derrors.New(derrors.Invalid, "invalid configuration")

// ParsePools parses QUOTA_REDIS_POOLS: comma-separated class=redis-url pairs, e.g.
// "free=redis://r1:6379/0,pro=redis://r2:6379/0". A pool on a Redis Cluster is a URL
// with cluster=true and its further seeds as addr parameters, e.g.
// "pro=redis://c1:7000?cluster=true&addr=c2:7001". Blanks around items are ignored;
// an empty string is no pools. The classes and URLs are those quota.EnginesConfig's
// Pools takes. Every problem is reported, joined, wrapping ErrInvalid;
// the messages never contain a URL's password.
func ParsePools(s string) (map[string]string, error) {
	pools := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return pools, nil
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: QUOTA_REDIS_POOLS: "+format, append([]any{ErrInvalid}, args...)...))
	}
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			bad("item %d is empty", i+1)
			continue
		}
		class, u, ok := strings.Cut(item, "=")
		class, u = strings.TrimSpace(class), strings.TrimSpace(u)
		if !ok {
			bad("item %d (%q) is not class=redis-url", i+1, redact.Item(item))
			continue
		}
		if !vocab.ValidID(class) {
			bad("item %d: pool class %q is not a valid id", i+1, class)
			continue
		}
		if _, dup := pools[class]; dup {
			bad("pool class %q is given twice", class)
			continue
		}
		if u == "" {
			bad("pool %q has no redis url", class)
			continue
		}
		if _, err := redisconn.Parse(u, false); err != nil {
			bad("pool %q: redis url %s: %v", class, redact.URL(u), redact.Error(err, u))
			continue
		}
		pools[class] = u
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return pools, nil
}
