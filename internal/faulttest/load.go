package faulttest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// outcome is what a client was told.
type outcome uint8

const (
	okay     outcome = iota + 1 // 200 or 201: admitted, committed, released
	denied                      // 429: nothing counted
	unknown                     // sent, no definite answer (a timeout, a reset, a 5xx): may or may not have counted
	notSent                     // the connection was refused: nothing reached the replica
	settled                     // 409 on a commit or release: the reservation was settled otherwise
	notFound                    // 404 on a commit or release
	rejected                    // any other 4xx: a driver bug, reported
)

func (o outcome) String() string {
	return [...]string{"?", "ok", "denied", "unknown", "not-sent", "settled", "not-found", "rejected"}[o]
}

// checkOp is one check a client sent.
type checkOp struct {
	team, user string
	metric     string // "" is requests
	cost       int64
	start, end time.Time
	out        outcome
	leased     bool
	replica    int
}

// resvOp is one reservation a client asked for and what it did with it.
type resvOp struct {
	team, user   string
	amount       int64
	onExpiry     string // commit or release
	ttl          time.Duration
	start, end   time.Time // of the reserve call
	out          outcome
	id           string
	action       string // commit, release, or "" (left to expire)
	used         int64
	settleOut    outcome
	settleStatus int
	settleEnd    time.Time
	replica      int       // of the reserve call
	engineAt     time.Time // the replica's engine clock at the reserve (ms): expires_at less the ttl
}

// expiryUnits is what the reservation counts when it expires.
func (r *resvOp) expiryUnits() int64 {
	if r.onExpiry == "commit" {
		return r.amount
	}
	return 0
}

// history is everything the clients were told.
type history struct {
	mu       sync.Mutex
	checks   []checkOp
	resvs    []resvOp
	rejected []string // bodies of 4xx answers the driver did not expect (at most 20)
}

func (h *history) add(checks []checkOp, resvs []resvOp) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks = append(h.checks, checks...)
	h.resvs = append(h.resvs, resvs...)
}

func (h *history) reject(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.rejected) < 20 {
		h.rejected = append(h.rejected, what)
	}
}

// loadClient calls the replicas as the org's check key.
type loadClient struct {
	http  *http.Client
	addrs []string
	key   string
	org   string
	hist  *history
}

func newLoadClient(addrs []string, key, org string, hist *history) *loadClient {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	return &loadClient{http: &http.Client{Transport: tr, Timeout: 5 * time.Second}, addrs: addrs, key: key, org: org, hist: hist}
}

// do sends one request to replica i. A POST without an Idempotency-Key header is never
// re-sent by net/http, so a request runs at most once.
func (c *loadClient) do(i int, method, path string, body any) (int, []byte, outcome) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+c.addrs[i]+path, rd)
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.http.Do(req)
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return 0, nil, notSent
		}
		return 0, nil, unknown
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return res.StatusCode, nil, unknown
	}
	switch {
	case res.StatusCode == 200 || res.StatusCode == 201:
		return res.StatusCode, b, okay
	case res.StatusCode == 429:
		return res.StatusCode, b, denied
	case res.StatusCode == 409:
		return res.StatusCode, b, settled
	case res.StatusCode == 404:
		return res.StatusCode, b, notFound
	case res.StatusCode >= 500:
		return res.StatusCode, b, unknown
	}
	c.hist.reject(fmt.Sprintf("%s %s: %d %s", method, path, res.StatusCode, b))
	return res.StatusCode, b, rejected
}

func (c *loadClient) check(i int, team, user, metric string, cost int64) checkOp {
	op := checkOp{team: team, user: user, metric: metric, cost: cost, replica: i, start: time.Now()}
	_, b, out := c.do(i, "POST", "/v1/check", map[string]any{"org": c.org, "team": team, "user": user, "metric": metric, "cost": cost})
	op.end, op.out = time.Now(), out
	if out == okay {
		var res struct {
			Allowed  bool `json:"allowed"`
			Leased   bool `json:"leased"`
			Degraded bool `json:"degraded"`
		}
		if err := json.Unmarshal(b, &res); err != nil || !res.Allowed || res.Degraded {
			// A closed plan never answers degraded; say so if it does.
			c.hist.reject(fmt.Sprintf("check answered 200 with %s", b))
		}
		op.leased = res.Leased
	}
	return op
}

// knowCapacity waits until every replica draws on cp: a replica learns of a capacity
// made on another over pub/sub, a moment later. The probe, a check of limit+1 by a user
// of team probe (a month limit of 1), counts nothing either way: a replica that knows
// the capacity refuses it there, one that does not at the user's limit.
func (c *loadClient) knowCapacity(ctx context.Context, cp capacityDef) error {
	body := map[string]any{"org": c.org, "team": "probe", "user": "p0", "metric": cp.metric, "cost": cp.limit + 1}
	for i := range c.addrs {
		deadline := time.Now().Add(10 * time.Second)
		for {
			code, b, _ := c.do(i, "POST", "/v1/check", body)
			var res struct {
				BlockedAt *struct {
					Level string `json:"level"`
				} `json:"blocked_at"`
			}
			if code == http.StatusTooManyRequests && json.Unmarshal(b, &res) == nil && res.BlockedAt != nil && res.BlockedAt.Level == "capacity" {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("api-%d does not draw on capacity %s 10 s after it was made: %d %s", i, cp.id, code, b)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return nil
}

// fields is the counters the check counts on.
func (c *checkOp) fields() []string {
	m := c.metric
	if m == "" {
		m = "requests"
	}
	return pathFields(m, c.team, c.user)
}

// workload is the traffic the driver sends: which teams and users, how hard.
type workload struct {
	monthUsers, rateUsers, burstUsers, resvUsers int
	capUsers                                     int // users of team cap, each offering about twice the capacity's rate
	hotPerReplica                                int // goroutines per replica on the hot path
	monthWorkers, resvWorkers                    int
	hotDenialsToMove                             int64 // 429s on a hot user before the hot path moves to the next user
}

// hotState is the current hot user: the hot path moves to the next user once the
// current one's month limit is spent, so every fault finds a hot path being leased.
type hotState struct {
	idx     atomic.Int64
	denials atomic.Int64
}

func hotUser(i int64) string { return fmt.Sprintf("h%d", i) }

// userEpoch is how long the users of teams month and resv are the same: their month
// limits are spent in about a minute, so a long run moves on to new ones.
const userEpoch = time.Minute

// epochUser names user i of the current epoch: m0.3 is user 3 of the first minute.
func epochUser(prefix string, start time.Time, i int) string {
	return fmt.Sprintf("%s%d.%d", prefix, int(time.Since(start)/userEpoch), i)
}

// runLoad drives the workload until ctx ends and returns when every client has
// finished its last call.
func runLoad(ctx context.Context, c *loadClient, w workload, seed uint64) (*hotState, *sync.WaitGroup) {
	var wg sync.WaitGroup
	hot := &hotState{}
	n := len(c.addrs)
	start := time.Now()
	spawn := func(id int, fn func(r *rand.Rand) ([]checkOp, []resvOp)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(id)))
			checks, resvs := fn(r)
			c.hist.add(checks, resvs)
		}()
	}
	id := 0
	// The hot path: one user at a time of team hot, from every replica at once.
	for i := range n {
		for range w.hotPerReplica {
			id++
			spawn(id, func(r *rand.Rand) ([]checkOp, []resvOp) {
				var out []checkOp
				for ctx.Err() == nil {
					u := hot.idx.Load()
					op := c.check(i, "hot", hotUser(u), "requests", 1)
					out = append(out, op)
					switch op.out {
					case denied:
						if hot.denials.Add(1) >= w.hotDenialsToMove && hot.idx.CompareAndSwap(u, u+1) {
							hot.denials.Store(0)
						}
					case notSent, unknown:
						time.Sleep(20 * time.Millisecond)
					}
				}
				return out, nil
			})
		}
	}
	// Spent hot users again, a few checks a second each: units a fault gave back
	// uncounted (a dead replica's lease released) would be admitted again here.
	id++
	spawn(id, func(r *rand.Rand) ([]checkOp, []resvOp) {
		var out []checkOp
		for ctx.Err() == nil {
			if u := hot.idx.Load(); u > 0 {
				out = append(out, c.check(r.IntN(n), "hot", hotUser(r.Int64N(u)), "requests", 1))
			}
			time.Sleep(time.Duration(5+r.IntN(10)) * time.Millisecond)
		}
		return out, nil
	})
	// Month limits: users of team month, random replicas, costs 1 to 3.
	for range w.monthWorkers {
		id++
		spawn(id, func(r *rand.Rand) ([]checkOp, []resvOp) {
			var out []checkOp
			for ctx.Err() == nil {
				op := c.check(r.IntN(n), "month", epochUser("m", start, r.IntN(w.monthUsers)), "requests", 1+r.Int64N(3))
				out = append(out, op)
				time.Sleep(time.Duration(2+r.IntN(6)) * time.Millisecond)
			}
			return out, nil
		})
	}
	// Sliding windows: one client per user of team rate, about 50 checks a second.
	for u := range w.rateUsers {
		id++
		spawn(id, func(r *rand.Rand) ([]checkOp, []resvOp) {
			var out []checkOp
			for ctx.Err() == nil {
				out = append(out, c.check(r.IntN(n), "rate", fmt.Sprintf("r%d", u), "requests", 1))
				time.Sleep(time.Duration(10+r.IntN(20)) * time.Millisecond)
			}
			return out, nil
		})
	}
	// Token buckets: one client per user of team burst, pressing the bucket past empty
	// (about 100 checks a second of costs 1 to 3, against 10 units a second) for 1-3 s,
	// then resting 0.5-3.5 s while it refills (30 units take 3 s): about 50 checks a
	// second, and a burst to spend at the start of most presses.
	for u := range w.burstUsers {
		id++
		spawn(id, func(r *rand.Rand) ([]checkOp, []resvOp) {
			var out []checkOp
			for ctx.Err() == nil {
				press := time.Now().Add(time.Duration(1000+r.IntN(2000)) * time.Millisecond)
				for ctx.Err() == nil && time.Now().Before(press) {
					out = append(out, c.check(r.IntN(n), "burst", fmt.Sprintf("b%d", u), "requests", 1+r.Int64N(3)))
					time.Sleep(time.Duration(5+r.IntN(10)) * time.Millisecond)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(500+r.IntN(3000)) * time.Millisecond):
				}
			}
			return out, nil
		})
	}
	// The capacity: users of team cap checking gpu units, each offering about
	// 130 checks a second of costs 1 to 2 against the capacity's 100 a second.
	for u := range w.capUsers {
		id++
		spawn(id, func(r *rand.Rand) ([]checkOp, []resvOp) {
			var out []checkOp
			for ctx.Err() == nil {
				out = append(out, c.check(r.IntN(n), "cap", fmt.Sprintf("c%d", u), "gpu", 1+r.Int64N(2)))
				time.Sleep(time.Duration(4+r.IntN(7)) * time.Millisecond)
			}
			return out, nil
		})
	}
	// Reservations of tokens: committed with used <= amount, released, or left to expire.
	for range w.resvWorkers {
		id++
		spawn(id, func(r *rand.Rand) ([]checkOp, []resvOp) {
			var out []resvOp
			for ctx.Err() == nil {
				out = append(out, c.reservation(r, n, epochUser("v", start, r.IntN(w.resvUsers))))
				time.Sleep(time.Duration(2+r.IntN(8)) * time.Millisecond)
			}
			return nil, out
		})
	}
	return hot, &wg
}

func (c *loadClient) reservation(r *rand.Rand, n int, user string) resvOp {
	op := resvOp{team: "resv", user: user, amount: 1 + r.Int64N(50), onExpiry: "commit", ttl: 5 * time.Second}
	if r.IntN(2) == 0 {
		op.onExpiry = "release"
	}
	switch p := r.IntN(10); {
	case p < 6:
		op.action, op.used = "commit", r.Int64N(op.amount+1)
	case p < 8:
		op.action = "release"
	default:
		op.ttl = time.Duration(1+r.IntN(3)) * time.Second // left to expire
	}
	op.replica = r.IntN(n)
	op.start = time.Now()
	_, b, out := c.do(op.replica, "POST", "/v1/reservations", map[string]any{"org": c.org, "team": op.team, "user": op.user,
		"metric": "tokens", "amount": op.amount, "ttl_seconds": int(op.ttl / time.Second), "on_expiry": op.onExpiry})
	op.end, op.out = time.Now(), out
	if out != okay {
		return op
	}
	var res struct {
		ID        string    `json:"id"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(b, &res); err != nil || res.ID == "" || res.ExpiresAt.IsZero() {
		c.hist.reject(fmt.Sprintf("reserve answered 201 with %s", b))
		op.out = rejected
		return op
	}
	op.id, op.engineAt = res.ID, res.ExpiresAt.Add(-op.ttl)
	if op.action == "" {
		return op
	}
	time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
	if op.action == "commit" {
		op.settleStatus, _, op.settleOut = c.do(r.IntN(n), "POST", "/v1/reservations/"+op.id+"/commit", map[string]any{"used": op.used})
	} else {
		op.settleStatus, _, op.settleOut = c.do(r.IntN(n), "DELETE", "/v1/reservations/"+op.id, nil)
	}
	op.settleEnd = time.Now()
	return op
}
