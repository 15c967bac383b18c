package tenants

import (
	"context"
	"time"
)

// SetCacheClock sets the clock a cache ages its entries by.
func SetCacheClock(c *Cache, now func() time.Time) { c.now = now }

// RefreshKeysNow runs one round of RefreshKeys; keys past half their TTL are queued
// from the first call on, as while RefreshKeys runs.
func RefreshKeysNow(ctx context.Context, c *Cache) {
	c.refreshing.Store(true)
	c.refreshKeys(ctx)
}
