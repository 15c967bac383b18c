package tenants

import (
	"context"
	"sync/atomic"
	"time"
)

// DefaultCapacityTTL is how old a Cache's capacities may grow before they are read
// again in the background.
const DefaultCapacityTTL = 30 * time.Second

// capacityRetry spaces the background reads of the capacities after one failed.
const capacityRetry = time.Second

// capacityReadTimeout bounds one read of the capacities off the check path.
const capacityReadTimeout = 5 * time.Second

// capacityCache holds every capacity, by metric, in process: a short list the
// operator owns, which every check of a metric with a capacity needs. It is read off
// the check path: again at once by the replica that changed it (in the change's own
// goroutine, so the write answers after the list is read again), in the background by
// the others when the invalidation channel tells them (and on every (re)subscription),
// in the background when the cache is made, and past ttl. A check
// reads Postgres for it only when the cache holds no list yet; else it takes the list it
// has, and asks for a background read when the list is older than a change it heard
// of (a read that failed or overlapped the change). While Postgres is down the last
// list read serves.
type capacityCache struct {
	ttl     time.Duration
	gen     atomic.Uint64 // bumped by every change of the capacities heard of
	snap    atomic.Pointer[capacitySnapshot]
	next    atomic.Int64 // unix ns before which no background read starts (after a failure)
	reading atomic.Bool  // a background read runs
	again   atomic.Bool  // a background read is asked for: the one running reads once more
}

type capacitySnapshot struct {
	set     CapacitySet
	gen     uint64 // c.gen at its read
	fetched time.Time
}

// Capacities returns every capacity by metric. With none read yet it reads them (once
// for all the checks waiting) and fails with an error that is not ErrNotFound when
// Postgres does not answer; else it answers from memory.
func (c *Cache) Capacities(ctx context.Context) (CapacitySet, error) {
	s := c.caps.snap.Load()
	if s == nil {
		v, err, _ := c.sf.Do("\x00capacities", func() (any, error) { return c.readCapacities(ctx) })
		if err != nil {
			return CapacitySet{}, err
		}
		return v.(*capacitySnapshot).set, nil
	}
	if s.gen != c.caps.gen.Load() || time.Since(s.fetched) >= c.caps.ttl {
		c.refreshCapacities()
	}
	return s.set, nil
}

// readCapacities reads every capacity and keeps the list, unless a list read after a
// later change is kept already.
func (c *Cache) readCapacities(ctx context.Context) (*capacitySnapshot, error) {
	gen := c.caps.gen.Load()
	cs, err := c.svc.AllCapacities(ctx)
	if err != nil {
		return nil, err
	}
	s := &capacitySnapshot{set: newCapacitySet(cs), gen: gen, fetched: time.Now()}
	for {
		old := c.caps.snap.Load()
		if old != nil && old.gen > gen {
			return old, nil
		}
		if c.caps.snap.CompareAndSwap(old, s) {
			return s, nil
		}
	}
}

// capacitiesChanged is told of a change of the capacities: it reads them again at
// once (local: the change is this replica's) or in the background.
func (c *Cache) capacitiesChanged(local bool) {
	c.caps.gen.Add(1)
	if !local {
		c.refreshCapacities()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), capacityReadTimeout)
	defer cancel()
	if _, err := c.readCapacities(ctx); err != nil {
		c.log.Warn("cannot read the capacities after a change; they are read again in the background", "err", err.Error())
	}
}

// refreshCapacities reads the capacities again in the background: one read at a time
// (one asked for while a read runs is made after it, so no change heard of during a
// read is missed), and none for capacityRetry after one failed. The capacities' times
// are the local clock's (not the Cache's, which tests move).
func (c *Cache) refreshCapacities() {
	if time.Now().UnixNano() < c.caps.next.Load() {
		return
	}
	c.caps.again.Store(true)
	if !c.caps.reading.CompareAndSwap(false, true) {
		return
	}
	go func() {
		for {
			for c.caps.again.Swap(false) {
				ctx, cancel := context.WithTimeout(context.Background(), capacityReadTimeout)
				_, err := c.readCapacities(ctx)
				cancel()
				if err != nil {
					c.caps.next.Store(time.Now().Add(capacityRetry).UnixNano())
					c.log.Warn("cannot read the capacities; the last list read serves", "err", err.Error())
					c.caps.again.Store(false)
				}
			}
			c.caps.reading.Store(false)
			if !c.caps.again.Load() || !c.caps.reading.CompareAndSwap(false, true) {
				return
			}
		}
	}()
}
