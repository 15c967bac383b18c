package faulttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// cluster is what the schedule runs on: a private redis-server, a proxy between the
// api replicas and it, the worker (straight to Redis), and the replicas, all real
// processes built from the checkout, on a fresh Postgres database.
type cluster struct {
	redis      *redisServer
	proxy      *proxy
	worker     *testenv.Proc
	workerHTTP string
	apis       []*testenv.Proc
	apiAddrs   []string
	opToken    string
	dbURL      string
	period     string // of the run, set after setup
	// heldAtKill is the ids of the reservations and leases held when Redis was last
	// killed (killRedis), for ledger.
	heldAtKill map[string]bool
	// dirtyAtKill is the counter fields in the dirty set when Redis was last killed:
	// a field Redis holds above the ledger but not dirty is one no flush will persist.
	dirtyAtKill map[string]bool
	// onPause, when set, runs while Redis's writes are paused before a kill (the
	// lease watcher reads the leases Redis holds, which it may not have seen yet).
	onPause func(context.Context)
	logf    func(format string, args ...any)

	mu      sync.Mutex // serializes restarts against the final stop
	stopped bool
}

// clusterConfig says how to start the cluster.
type clusterConfig struct {
	APIBin, WorkerBin string
	DatabaseURL       string
	Replicas          int
	FlushInterval     time.Duration
	Sweep             time.Duration
	FaultClock        bool // QUOTA_FAULT_CLOCK=on: SIGUSR1/SIGUSR2 step the engine's clock
	freePort          func() int
	Logf              func(format string, args ...any)
}

func startCluster(cfg clusterConfig) (*cluster, error) {
	c := &cluster{opToken: "faults-operator-" + randHex(8), dbURL: cfg.DatabaseURL, logf: cfg.Logf}
	c.redis = newRedisServer(cfg.freePort())
	if err := c.redis.startAndWait(); err != nil {
		return c, err
	}
	var err error
	if c.proxy, err = newProxy(fmt.Sprintf("127.0.0.1:%d", cfg.freePort()), c.redis.addr()); err != nil {
		return c, err
	}
	common := append(testenv.CleanEnviron(),
		"DATABASE_URL="+cfg.DatabaseURL,
		"QUOTA_ADMIN_TOKEN="+c.opToken,
		"QUOTA_LOG_LEVEL=warn",
		"QUOTA_STARTUP_TIMEOUT=30s",
		"QUOTA_GRPC_ADDR=off",
	)
	if cfg.FaultClock {
		common = append(common, "QUOTA_FAULT_CLOCK=on")
	}
	c.workerHTTP = fmt.Sprintf("127.0.0.1:%d", cfg.freePort())
	workerEnv := append(append([]string(nil), common...),
		"REDIS_URL=redis://"+c.redis.addr()+"/0",
		"QUOTA_WORKER_HTTP_ADDR="+c.workerHTTP,
		"QUOTA_FLUSH_INTERVAL="+cfg.FlushInterval.String(),
		"QUOTA_RESERVATION_SWEEP="+cfg.Sweep.String(),
	)
	c.worker = &testenv.Proc{Name: "worker", Path: cfg.WorkerBin, Env: workerEnv}
	if err := c.worker.Start(); err != nil {
		return c, err
	}
	for i := range cfg.Replicas {
		addr := fmt.Sprintf("127.0.0.1:%d", cfg.freePort())
		env := append(append([]string(nil), common...),
			"REDIS_URL=redis://"+c.proxy.addr()+"/0",
			"QUOTA_HTTP_ADDR="+addr,
			fmt.Sprintf("QUOTA_REPLICAS=%d", cfg.Replicas),
			// A cut connection fails a check within a second (503 under a closed plan),
			// while a machine busy with the schedule does not time out healthy calls.
			"QUOTA_REDIS_TIMEOUT=1s",
			"QUOTA_ADMIN_RATE_LIMIT=off",
		)
		p := &testenv.Proc{Name: fmt.Sprintf("api-%d", i), Path: cfg.APIBin, Env: env}
		c.apis = append(c.apis, p)
		c.apiAddrs = append(c.apiAddrs, addr)
		if err := p.Start(); err != nil {
			return c, err
		}
	}
	for i := range c.apis {
		if err := c.waitAPI(i); err != nil {
			return c, err
		}
	}
	return c, c.waitWorker()
}

// waitWorker waits until the worker's /healthz answers: its queue and flusher run.
func (c *cluster) waitWorker() error {
	if err := waitHTTP("http://"+c.workerHTTP+"/healthz", 60*time.Second); err != nil {
		return fmt.Errorf("worker: %w\n%s", err, c.worker.Log.String())
	}
	return nil
}

func (c *cluster) waitAPI(i int) error {
	if err := waitHTTP("http://"+c.apiAddrs[i]+"/readyz", 60*time.Second); err != nil {
		return fmt.Errorf("api-%d: %w\n%s", i, err, c.apis[i].Log.String())
	}
	return nil
}

// restartAPI starts replica i again and waits for it to be ready.
func (c *cluster) restartAPI(i int) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	err := c.apis[i].Start()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitAPI(i)
}

// restartWorker starts the worker again and waits until it flushes.
func (c *cluster) restartWorker() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	err := c.worker.Start()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitWorker()
}

func (c *cluster) restartRedis() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	return c.redis.startAndWait()
}

// lastFlush reads when the worker's last complete flush started
// (quotaplane_worker_last_flush_timestamp_seconds); zero when it has not flushed yet.
func (c *cluster) lastFlush(ctx context.Context) time.Time {
	var raw []byte
	if err := c.call(ctx, c.workerHTTP, "", "GET", "/metrics", nil, &raw); err != nil {
		return time.Time{}
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "quotaplane_worker_last_flush_timestamp_seconds "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil || f <= 0 {
				return time.Time{}
			}
			return time.Unix(0, int64(f*1e9))
		}
	}
	return time.Time{}
}

// killRedis pauses Redis's writes, reads the org's month counters (held units
// included), and kills Redis -9: the snapshot is what Redis held when it died.
func (c *cluster) killRedis(ctx context.Context) (map[string]int64, error) {
	rdb := redis.NewClient(&redis.Options{Addr: c.redis.addr(), MaxRetries: -1})
	defer rdb.Close()
	snap, err := func() (map[string]int64, error) {
		if err := rdb.Do(ctx, "CLIENT", "PAUSE", "5000", "WRITE").Err(); err != nil {
			return nil, err
		}
		if c.onPause != nil {
			c.onPause(ctx)
		}
		m, err := rdb.HGetAll(ctx, "q:{"+org+"}|m|"+c.period).Result()
		if err != nil {
			return nil, err
		}
		held, err := rdb.ZRange(ctx, "q:{"+org+"}|x", 0, -1).Result()
		if err != nil {
			return nil, err
		}
		c.heldAtKill = map[string]bool{}
		for _, id := range held {
			c.heldAtKill[id] = true
		}
		dirty, err := rdb.SMembers(ctx, "q:{"+org+"}|d|"+c.period).Result()
		if err != nil {
			return nil, err
		}
		c.dirtyAtKill = map[string]bool{}
		for _, f := range dirty {
			c.dirtyAtKill[f] = true
		}
		if _, ok := m["|p"]; !ok {
			// Not hydrated since the last restart: no check was decided on this Redis
			// (the scripts refuse without the marker), so it holds nothing to lose.
			return nil, nil
		}
		out := map[string]int64{}
		for f, v := range m {
			if !strings.HasPrefix(f, "|") { // the period marker
				out[f], _ = strconv.ParseInt(v, 10, 64)
			}
		}
		return out, nil
	}()
	c.redis.Kill9()
	return snap, err
}

// ledger reads the org's persisted counters of the period from Postgres, with the
// units of the reservations (and leases) it persisted held: what a Redis that restarts
// empty is hydrated with, and will come to. A reservation the ledger holds but that
// was settled in Redis at the kill (since the last flush) is held again after the
// restart, and nobody settles it twice: it counts what its expiry will count (its
// amount under on_expiry commit, nothing under release).
func (c *cluster) ledger(ctx context.Context) (map[string]int64, error) {
	conn, err := pgx.Connect(ctx, c.dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT metric, level, team_id, user_id, units FROM usage_counters WHERE org_id = $1 AND period = $2`, org, c.period)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for rows.Next() {
		var metric, level, team, user string
		var units int64
		if err := rows.Scan(&metric, &level, &team, &user, &units); err != nil {
			return nil, err
		}
		switch level {
		case "org":
			out[metric+"|o"] = units
		case "team":
			out[metric+"|t|"+team] = units
		default:
			out[metric+"|u|"+team+"|"+user] = units
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = conn.Query(ctx, `SELECT id, record FROM reservations WHERE org_id = $1 AND period = $2 AND state = 'held'`, org, c.period)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var rec map[string]string
		if err := rows.Scan(&id, &rec); err != nil {
			return nil, err
		}
		amount, _ := strconv.ParseInt(rec["a"], 10, 64)
		if !c.heldAtKill[id] && rec["x"] != "commit" {
			amount = 0
		}
		nl, _ := strconv.Atoi(rec["nl"])
		for l := 1; l <= nl; l++ {
			out[rec["f"+strconv.Itoa(l)]] += amount
		}
	}
	return out, rows.Err()
}

// stepClock steps the engine clock of replica i by +2 s (forward) or -2 s.
func (c *cluster) stepClock(i int, forward bool) error {
	sig := syscall.SIGUSR2
	if forward {
		sig = syscall.SIGUSR1
	}
	return c.apis[i].Signal(sig)
}

// stepWorkerClock steps the worker's engine clock by +2 s (forward) or -2 s.
func (c *cluster) stepWorkerClock(forward bool) error {
	sig := syscall.SIGUSR2
	if forward {
		sig = syscall.SIGUSR1
	}
	return c.worker.Signal(sig)
}

// stop ends every process the cluster started (SIGTERM, then SIGKILL after a few
// seconds) and the proxy. Safe to call more than once.
func (c *cluster) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range c.apis {
		wg.Add(1)
		go func() { defer wg.Done(); p.Stop(5 * time.Second) }()
	}
	wg.Wait()
	if c.worker != nil {
		c.worker.Stop(5 * time.Second)
	}
	if c.proxy != nil {
		c.proxy.close()
	}
	if c.redis != nil {
		c.redis.Kill9()
	}
}

// logs returns the tail of every process's output.
func (c *cluster) logs() string {
	var b strings.Builder
	for i, p := range c.apis {
		fmt.Fprintf(&b, "--- api-%d (%s)\n%s\n", i, c.apiAddrs[i], p.Log.String())
	}
	if c.worker != nil {
		fmt.Fprintf(&b, "--- worker\n%s\n", c.worker.Log.String())
	}
	return b.String()
}

// operator calls the api as the operator (replica 0, falling back to the others).
func (c *cluster) operator(ctx context.Context, method, path string, body any, out any) error {
	var last error
	for attempt := range 20 {
		for i := range c.apis {
			err := c.call(ctx, c.apiAddrs[i], c.opToken, method, path, body, out)
			if err == nil {
				return nil
			}
			last = err
			var se *statusError
			if errors.As(err, &se) && se.status < 500 {
				return err
			}
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	return last
}

type statusError struct {
	status int
	body   string
}

func (e *statusError) Error() string { return fmt.Sprintf("status %d: %s", e.status, e.body) }

var opClient = &http.Client{Timeout: 30 * time.Second}

func (c *cluster) call(ctx context.Context, addr, token, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := opClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode/100 != 2 {
		return &statusError{status: res.StatusCode, body: string(b)}
	}
	if out == nil {
		return nil
	}
	if p, ok := out.(*[]byte); ok {
		*p = b
		return nil
	}
	return json.Unmarshal(b, out)
}

// freePort returns a port nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%x", b)
}
