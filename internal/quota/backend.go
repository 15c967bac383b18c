package quota

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/redact"
	"github.com/quotaplane/quotaplane/internal/platform/redisconn"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// backendEntry creates its backend once, whoever asks first.
type backendEntry struct {
	once sync.Once
	b    atomic.Pointer[backend]
	err  error
}

func (e *backendEntry) ready() *backend { return e.b.Load() }

// backend is one Redis (a server or a cluster): its client, engine and breakers.
type backend struct {
	name     string
	rdb      redis.UniversalClient
	cluster  *redis.ClusterClient // rdb on a cluster, else nil
	eng      *Engine
	breakers BreakerConfig
	cb       *breaker // the breaker of a single server; of a cluster without a slot map
	shards   sync.Map // cluster: primary "host:port" -> *breaker
	inflight atomic.Int64
	poll     pollState // background polls' backoff (a dedicated Redis only)
}

// state is the worst state of the backend's breakers: on a cluster, of its current
// primaries (a breaker of a node that is no longer primary is dropped).
func (b *backend) state() gobreaker.State {
	worst := b.cb.State()
	if b.cluster == nil {
		return worst
	}
	primaries := map[string]bool{}
	var mu sync.Mutex
	_ = b.cluster.ForEachMaster(context.Background(), func(_ context.Context, m *redis.Client) error {
		mu.Lock()
		primaries[m.Options().Addr] = true
		mu.Unlock()
		return nil
	})
	b.shards.Range(func(k, v any) bool {
		if !primaries[k.(string)] {
			b.shards.Delete(k)
			return true
		}
		worst = max(worst, v.(*breaker).State())
		return true
	})
	return worst
}

// backendFor returns the backend of url, creating it on first use.
func (r *Engines) backendFor(u string) (*backend, error) {
	v, ok := r.backends.Load(u)
	if !ok {
		v, _ = r.backends.LoadOrStore(u, &backendEntry{})
	}
	e := v.(*backendEntry)
	if b := e.b.Load(); b != nil {
		return b, nil
	}
	e.once.Do(func() {
		b, err := r.newBackend(u)
		if err != nil {
			e.err = err
			return
		}
		e.b.Store(b)
	})
	if b := e.b.Load(); b != nil {
		return b, nil
	}
	return nil, e.err
}

func (r *Engines) newBackend(u string) (*backend, error) {
	name, ok := r.names[u]
	if !ok {
		name = DedicatedPool
	}
	o, err := redisconn.Parse(u, false)
	if err != nil {
		return nil, fmt.Errorf("%w: quota router: %s redis url %s: %s", ErrInvalid, name, redact.URL(u), redact.Error(err, u))
	}
	to := r.cfg.RedisTimeout
	if opt := o.Single; opt != nil {
		opt.MaxRetries = -1
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = to, to, to, to
		opt.DialerRetries = 1     // one dial attempt per connection: the breaker does the waiting
		opt.PipelinePoolSize = -1 // pipelines on the main pool: a dead Redis would cost two handshake timeouts otherwise
		if r.cfg.PoolSize > 0 {
			opt.PoolSize = r.cfg.PoolSize
		}
	}
	if opt := o.Cluster; opt != nil {
		// The engine re-sends a check only when Redis says it did not run it (a
		// redirect, a failover in progress, a refused dial); go-redis must not
		// re-send anything itself.
		opt.MaxRetries, opt.MaxRedirects = -1, -1
		opt.ReadOnly, opt.RouteByLatency, opt.RouteRandomly = false, false, false
		opt.DialTimeout, opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = to, to, to, to
		opt.DialerRetries = 1
		opt.PipelinePoolSize = -1
		if r.cfg.PoolSize > 0 {
			opt.PoolSize = r.cfg.PoolSize
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	rdb := o.Client()
	ecfg := r.cfg.Engine
	size, rtt := r.metrics.pipeSize.WithLabelValues(name), r.metrics.rtt.WithLabelValues(name)
	ecfg.OnPipeline = func(n int, d time.Duration) {
		size.Observe(float64(n))
		rtt.Observe(d.Seconds())
	}
	ecfg.OnResend = func(reason string) { r.metrics.resends.WithLabelValues(name, reason).Inc() }
	ecfg.OnReservation = r.metrics.reservation
	ecfg.Leases.OnLease = r.metrics.lease
	if ecfg.Leases.Replicas <= 0 {
		ecfg.Leases.Replicas = r.cfg.Replicas
	}
	eng, err := New(rdb, ecfg)
	if err != nil {
		_ = rdb.Close()
		return nil, err
	}
	b := &backend{name: name, rdb: rdb, eng: eng, breakers: r.cfg.Breaker}
	b.cluster, _ = rdb.(*redis.ClusterClient)
	b.cb = b.newBreaker(name)
	r.open = append(r.open, b)
	return b, nil
}
