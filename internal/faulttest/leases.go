package faulttest

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// leaseRecord is what the driver saw of one lease's record in Redis (KEYS.md "Leases":
// a reservation with id l_..., kept 10 minutes once settled).
type leaseRecord struct {
	id       string
	state    string // held, committed, expired (released if ever); lost when Redis lost it held
	amount   int64
	used     int64 // once settled
	onExpiry string
	fields   []string // counter fields it charged (org, team, user)
	created  time.Time
	settled  time.Time // once settled
}

// leaseWatcher reads the org's lease records from Redis (directly, not through the
// proxy) every interval, keeping the last state of each: a Redis restart erases the
// settled ones, and the held ones taken since the last flush, so the oracle could not
// read them at the end. New leases are found in the org's held set (x), and a lease
// is read again until it is seen settled.
type leaseWatcher struct {
	rdb    *redis.Client
	prefix string // <p>:{<org>}|
	mu     sync.Mutex
	seen   map[string]*leaseRecord
}

func newLeaseWatcher(addr, org string) *leaseWatcher {
	return &leaseWatcher{
		rdb:    redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second}),
		prefix: "q:{" + org + "}|",
		seen:   map[string]*leaseRecord{},
	}
}

func (w *leaseWatcher) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		w.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// poll reads every lease held now and every one seen held before.
func (w *leaseWatcher) poll(ctx context.Context) {
	held, err := w.rdb.ZRange(ctx, w.prefix+"x", 0, -1).Result()
	if err != nil {
		return
	}
	w.mu.Lock()
	var ids []string
	for _, id := range held {
		if strings.HasPrefix(id, "l_") && w.seen[id] == nil {
			ids = append(ids, id)
		}
	}
	for id, r := range w.seen {
		if r.state == "held" {
			ids = append(ids, id)
		}
	}
	w.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	pipe := w.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HGetAll(ctx, w.prefix+"r|"+id)
	}
	_, _ = pipe.Exec(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, id := range ids {
		h, err := cmds[i].Result()
		if err != nil {
			continue
		}
		if len(h) == 0 {
			if r := w.seen[id]; r != nil {
				r.state = "lost" // with Redis: a restart erased it while held
			}
			continue
		}
		r := &leaseRecord{id: id, state: h["s"], onExpiry: h["x"]}
		r.amount, _ = strconv.ParseInt(h["a"], 10, 64)
		r.used, _ = strconv.ParseInt(h["u"], 10, 64)
		if ms, err := strconv.ParseInt(h["c"], 10, 64); err == nil {
			r.created = time.UnixMilli(ms)
		}
		if ms, err := strconv.ParseInt(h["t"], 10, 64); err == nil {
			r.settled = time.UnixMilli(ms)
		}
		nl, _ := strconv.Atoi(h["nl"])
		for l := 1; l <= nl; l++ {
			r.fields = append(r.fields, h["f"+strconv.Itoa(l)])
		}
		w.seen[id] = r
	}
}

// records returns every lease seen.
func (w *leaseWatcher) records() []leaseRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]leaseRecord, 0, len(w.seen))
	for _, r := range w.seen {
		out = append(out, *r)
	}
	return out
}

func (w *leaseWatcher) close() { _ = w.rdb.Close() }
