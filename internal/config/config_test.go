package config_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/config"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDefaults(t *testing.T) {
	c, err := config.LoadWorker(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.DatabaseURL != config.DefaultDatabaseURL || c.RedisURL != config.DefaultRedisURL ||
		c.FlushInterval != 2*time.Second || c.AdminToken != "" || c.RedisCluster {
		t.Errorf("defaults = %+v", c)
	}
	a, err := config.LoadAPI(env(nil))
	if err != nil || a.HTTPAddr != "127.0.0.1:8080" {
		t.Errorf("api defaults = %+v, %v", a, err)
	}
}

func TestInvalidValuesAreAllReported(t *testing.T) {
	_, err := config.LoadWorker(env(map[string]string{
		"QUOTA_FLUSH_INTERVAL": "soon", "REDIS_CLUSTER": "maybe", "QUOTA_ADMIN_TOKEN": "short", "QUOTA_WORKER_HTTP_ADDR": "8081",
	}))
	for _, want := range []string{"QUOTA_FLUSH_INTERVAL", "REDIS_CLUSTER", "QUOTA_ADMIN_TOKEN", "QUOTA_WORKER_HTTP_ADDR"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

func TestSeedListSelectsCluster(t *testing.T) {
	c, err := config.LoadAPI(env(map[string]string{"REDIS_URL": "10.0.0.1:7000,10.0.0.2:7000"}))
	if err != nil || !c.RedisCluster {
		t.Errorf("seed list: cluster=%v err=%v", c.RedisCluster, err)
	}
}

func TestSecretsMaskedInLog(t *testing.T) {
	c, err := config.LoadAPI(env(map[string]string{
		"QUOTA_ADMIN_TOKEN":    "very-secret-operator-token",
		"DATABASE_URL":         "postgres://app:dbpassword@db/q",
		"REDIS_URL":            "redis://:redispassword@cache:6379/0",
		"QUOTA_WEBHOOK_SECRET": "very-secret-webhook-master",
	}))
	if err != nil || c.WebhookSecret != "very-secret-webhook-master" {
		t.Fatalf("api config: %+v, %v", c, err)
	}
	if _, err := config.LoadAPI(env(map[string]string{"QUOTA_WEBHOOK_SECRET": "short"})); err == nil || !strings.Contains(err.Error(), "QUOTA_WEBHOOK_SECRET") {
		t.Errorf("short QUOTA_WEBHOOK_SECRET for the api: %v", err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", c)
	for _, secret := range []string{"very-secret-operator-token", "dbpassword", "redispassword", "very-secret-webhook-master"} {
		if strings.Contains(buf.String(), secret) {
			t.Errorf("log line shows %q: %s", secret, buf.String())
		}
	}
}

func TestRedisPoolsAndLimits(t *testing.T) {
	c, err := config.LoadAPI(env(map[string]string{
		"QUOTA_REDIS_POOLS": "free=redis://:pw1@r1:6379/0, pro=redis://r2:6379/1", "QUOTA_MAX_INFLIGHT_PER_ORG": "64", "QUOTA_REPLICAS": "3",
		"QUOTA_METRICS_ORGS": "0",
	}))
	if err != nil || c.RedisPools["free"] != "redis://:pw1@r1:6379/0" || c.RedisPools["pro"] != "redis://r2:6379/1" ||
		c.MaxInFlightPerOrg != 64 || c.Replicas != 3 || c.RedisTimeout != 100*time.Millisecond || c.MetricsOrgs != 0 {
		t.Fatalf("config = %+v, %v", c, err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("config", "config", c)
	if strings.Contains(buf.String(), "pw1") {
		t.Errorf("pool password in the log: %s", buf.String())
	}
	_, err = config.LoadAPI(env(map[string]string{"QUOTA_REDIS_POOLS": "free", "QUOTA_REPLICAS": "0", "QUOTA_METRICS_ORGS": "-1"}))
	if err == nil || !strings.Contains(err.Error(), "QUOTA_REDIS_POOLS") || !strings.Contains(err.Error(), "QUOTA_REPLICAS") ||
		!strings.Contains(err.Error(), "QUOTA_METRICS_ORGS") {
		t.Errorf("bad pools, replicas and metrics orgs: %v", err)
	}
	if c, err := config.LoadAPI(env(nil)); err != nil || c.MetricsOrgs != 100 {
		t.Errorf("default QUOTA_METRICS_ORGS = %d, %v; want 100", c.MetricsOrgs, err)
	}
}

func TestWorkerBillingSettings(t *testing.T) {
	c, err := config.LoadWorker(env(nil))
	if err != nil || c.WebhookSecret != "" || c.WebhookAllowPrivate || c.CloseGrace != time.Minute || len(c.RedisPools) != 0 {
		t.Fatalf("defaults = %+v, %v", c, err)
	}
	c, err = config.LoadWorker(env(map[string]string{"QUOTA_WEBHOOK_SECRET": "0123456789abcdef-secret",
		"QUOTA_WEBHOOK_ALLOW_PRIVATE": "true", "QUOTA_CLOSE_GRACE": "5m", "QUOTA_REDIS_POOLS": "pro=redis://:pw@r2:6379/1"}))
	if err != nil || !c.WebhookAllowPrivate || c.CloseGrace != 5*time.Minute || c.RedisPools["pro"] != "redis://:pw@r2:6379/1" {
		t.Fatalf("set = %+v, %v", c, err)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("cfg", "config", c)
	if strings.Contains(buf.String(), "0123456789abcdef-secret") || strings.Contains(buf.String(), ":pw@") {
		t.Fatalf("secret printed: %s", buf.String())
	}
	_, err = config.LoadWorker(env(map[string]string{"QUOTA_WEBHOOK_SECRET": "short", "QUOTA_WEBHOOK_ALLOW_PRIVATE": "yes please",
		"QUOTA_CLOSE_GRACE": "-1s"}))
	for _, want := range []string{"QUOTA_WEBHOOK_SECRET", "QUOTA_WEBHOOK_ALLOW_PRIVATE", "QUOTA_CLOSE_GRACE"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

func TestPprofOnlyOnLoopback(t *testing.T) {
	a, err := config.LoadAPI(env(nil))
	if err != nil || a.PprofAddr != "" {
		t.Errorf("pprof is off by default: %q, %v", a.PprofAddr, err)
	}
	for _, ok := range []string{"127.0.0.1:6060", "localhost:6060", "[::1]:6060"} {
		if a, err := config.LoadAPI(env(map[string]string{"QUOTA_PPROF_ADDR": ok})); err != nil || a.PprofAddr != ok {
			t.Errorf("QUOTA_PPROF_ADDR=%s: %q, %v", ok, a.PprofAddr, err)
		}
	}
	for _, bad := range []string{"0.0.0.0:6060", ":6060", "10.0.0.1:6060", "example.com:6060", "6060"} {
		if _, err := config.LoadAPI(env(map[string]string{"QUOTA_PPROF_ADDR": bad})); err == nil || !strings.Contains(err.Error(), "QUOTA_PPROF_ADDR") {
			t.Errorf("QUOTA_PPROF_ADDR=%s accepted (%v)", bad, err)
		}
	}
}

func TestCacheBounds(t *testing.T) {
	a, err := config.LoadAPI(env(nil))
	if err != nil || a.CacheOrgs != 1_000_000 || a.CacheUsers != 200_000 || a.CacheKeys != 500_000 || a.CacheMemoryMB != 512 {
		t.Fatalf("api defaults = %d %d %d, %v", a.CacheOrgs, a.CacheUsers, a.CacheKeys, err)
	}
	a, err = config.LoadAPI(env(map[string]string{"QUOTA_CACHE_ORGS": "50", "QUOTA_CACHE_USERS": "1000", "QUOTA_CACHE_KEYS": "7"}))
	if err != nil || a.CacheOrgs != 50 || a.CacheUsers != 1000 || a.CacheKeys != 7 {
		t.Fatalf("api set = %d %d %d, %v", a.CacheOrgs, a.CacheUsers, a.CacheKeys, err)
	}
	w, err := config.LoadWorker(env(map[string]string{"QUOTA_CACHE_ORGS": "20"}))
	if err != nil || w.CacheOrgs != 20 {
		t.Fatalf("worker QUOTA_CACHE_ORGS = %d, %v", w.CacheOrgs, err)
	}
	_, err = config.LoadAPI(env(map[string]string{"QUOTA_CACHE_ORGS": "0", "QUOTA_CACHE_USERS": "many", "QUOTA_CACHE_KEYS": "-1"}))
	for _, want := range []string{"QUOTA_CACHE_ORGS", "QUOTA_CACHE_USERS", "QUOTA_CACHE_KEYS"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
}

func TestListenOnABusyAddressNamesTheVariable(t *testing.T) {
	busy, err := config.Listen("QUOTA_HTTP_ADDR", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	ln, err := config.Listen("QUOTA_WORKER_HTTP_ADDR", busy.Addr().String())
	if err == nil {
		ln.Close()
		t.Fatal("second listener on a busy address")
	}
	for _, want := range []string{"QUOTA_WORKER_HTTP_ADDR=" + busy.Addr().String(), "already in use", "set QUOTA_WORKER_HTTP_ADDR to a free"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// The rate limit service listens on loopback by default, "off" turns it off, and
// descriptor aliases must name org, team, user or metric.
func TestGRPCSettings(t *testing.T) {
	a, err := config.LoadAPI(env(nil))
	if err != nil || a.GRPCAddr != "127.0.0.1:8082" || len(a.GRPCAliases) != 0 {
		t.Errorf("defaults: %q %v, %v", a.GRPCAddr, a.GRPCAliases, err)
	}
	a, err = config.LoadAPI(env(map[string]string{"QUOTA_GRPC_ADDR": "off", "QUOTA_GRPC_DESCRIPTOR_ALIASES": "x-user-id=user, x-team = team"}))
	if err != nil || a.GRPCAddr != "" || a.GRPCAliases["x-user-id"] != "user" || a.GRPCAliases["x-team"] != "team" || len(a.GRPCAliases) != 2 {
		t.Errorf("off and aliases: %q %v, %v", a.GRPCAddr, a.GRPCAliases, err)
	}
	for _, bad := range []map[string]string{
		{"QUOTA_GRPC_ADDR": "8082"},
		{"QUOTA_GRPC_DESCRIPTOR_ALIASES": "x-user-id=person"},
		{"QUOTA_GRPC_DESCRIPTOR_ALIASES": "user=team"},
		{"QUOTA_GRPC_DESCRIPTOR_ALIASES": "x-user-id"},
		{"QUOTA_GRPC_DESCRIPTOR_ALIASES": "a=user,a=team"},
	} {
		if _, err := config.LoadAPI(env(bad)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// QUOTA_FAULT_CLOCK, the clock fault hook, is off unless set to on, in both binaries.
func TestFaultClockIsOffByDefault(t *testing.T) {
	if a, err := config.LoadAPI(env(nil)); err != nil || a.FaultClock {
		t.Errorf("api default: fault clock %v, %v", a.FaultClock, err)
	}
	if w, err := config.LoadWorker(env(map[string]string{"QUOTA_FAULT_CLOCK": "on"})); err != nil || !w.FaultClock {
		t.Errorf("worker with on: fault clock %v, %v", w.FaultClock, err)
	}
	if a, err := config.LoadAPI(env(map[string]string{"QUOTA_FAULT_CLOCK": "off"})); err != nil || a.FaultClock {
		t.Errorf("api with off: fault clock %v, %v", a.FaultClock, err)
	}
	if _, err := config.LoadAPI(env(map[string]string{"QUOTA_FAULT_CLOCK": "yes"})); err == nil || !strings.Contains(err.Error(), "QUOTA_FAULT_CLOCK") {
		t.Errorf("QUOTA_FAULT_CLOCK=yes: %v, want an error naming it", err)
	}
}

// QUOTA_REDIS_PREFIX: both binaries read it, "q" by default (the prefix every key
// had before), and a prefix with key syntax in it is refused.
func TestRedisPrefix(t *testing.T) {
	w, err := config.LoadWorker(env(nil))
	a, err2 := config.LoadAPI(env(nil))
	if err != nil || err2 != nil || w.RedisPrefix != "q" || a.RedisPrefix != "q" {
		t.Errorf("default prefix: worker %q, api %q (%v, %v), want q", w.RedisPrefix, a.RedisPrefix, err, err2)
	}
	w, err = config.LoadWorker(env(map[string]string{"QUOTA_REDIS_PREFIX": "staging-2"}))
	a, err2 = config.LoadAPI(env(map[string]string{"QUOTA_REDIS_PREFIX": "staging-2"}))
	if err != nil || err2 != nil || w.RedisPrefix != "staging-2" || a.RedisPrefix != "staging-2" {
		t.Errorf("set prefix: worker %q, api %q (%v, %v)", w.RedisPrefix, a.RedisPrefix, err, err2)
	}
	for _, bad := range []string{"a{b}", "x|y", "p:q", strings.Repeat("p", 33)} {
		if _, err := config.LoadAPI(env(map[string]string{"QUOTA_REDIS_PREFIX": bad})); err == nil || !strings.Contains(err.Error(), "QUOTA_REDIS_PREFIX") {
			t.Errorf("prefix %q: %v, want an error naming QUOTA_REDIS_PREFIX", bad, err)
		}
	}
}

// The org's bounds on the shared Redis, with their defaults and "off".
func TestSharedRedisBounds(t *testing.T) {
	c, err := config.LoadAPI(env(nil))
	if err != nil || c.IdempotencyRecords != 100_000 || c.UnregisteredUsers != 100_000 {
		t.Fatalf("defaults = %d, %d, %v", c.IdempotencyRecords, c.UnregisteredUsers, err)
	}
	c, err = config.LoadAPI(env(map[string]string{"QUOTA_IDEMPOTENCY_RECORDS": "500", "QUOTA_UNREGISTERED_USERS": "off"}))
	if err != nil || c.IdempotencyRecords != 500 || c.UnregisteredUsers != -1 {
		t.Fatalf("500, off = %d, %d, %v", c.IdempotencyRecords, c.UnregisteredUsers, err)
	}
	_, err = config.LoadAPI(env(map[string]string{"QUOTA_IDEMPOTENCY_RECORDS": "-3", "QUOTA_UNREGISTERED_USERS": "many"}))
	if err == nil || !strings.Contains(err.Error(), "QUOTA_IDEMPOTENCY_RECORDS") || !strings.Contains(err.Error(), "QUOTA_UNREGISTERED_USERS") {
		t.Errorf("bad bounds: %v", err)
	}
}

// The gRPC listener's TLS files (both or neither), streams and keepalive.
func TestGRPCTransportSettings(t *testing.T) {
	c, err := config.LoadAPI(env(nil))
	if err != nil || c.GRPCTLSCert != "" || c.GRPCMaxStreams != 1024 || c.GRPCKeepaliveMinTime != 10*time.Second {
		t.Fatalf("defaults = %q, %d, %v, %v", c.GRPCTLSCert, c.GRPCMaxStreams, c.GRPCKeepaliveMinTime, err)
	}
	c, err = config.LoadAPI(env(map[string]string{"QUOTA_GRPC_TLS_CERT": "/tls/tls.crt", "QUOTA_GRPC_TLS_KEY": "/tls/tls.key",
		"QUOTA_GRPC_MAX_STREAMS": "64", "QUOTA_GRPC_KEEPALIVE_MIN_TIME": "30s"}))
	if err != nil || c.GRPCTLSKey != "/tls/tls.key" || c.GRPCMaxStreams != 64 || c.GRPCKeepaliveMinTime != 30*time.Second {
		t.Fatalf("set = %+v, %v", c, err)
	}
	if _, err := config.LoadAPI(env(map[string]string{"QUOTA_GRPC_TLS_CERT": "/tls/tls.crt", "QUOTA_GRPC_MAX_STREAMS": "0"})); err == nil ||
		!strings.Contains(err.Error(), "QUOTA_GRPC_TLS_KEY") || !strings.Contains(err.Error(), "QUOTA_GRPC_MAX_STREAMS") {
		t.Errorf("a certificate without its key, 0 streams: %v", err)
	}
	// The handshake deadline: 5 s by default, a positive duration when set.
	for v, want := range map[string]time.Duration{"": 5 * time.Second, "750ms": 750 * time.Millisecond} {
		if c, err := config.LoadAPI(env(map[string]string{"QUOTA_GRPC_HANDSHAKE_TIMEOUT": v})); err != nil || c.GRPCHandshakeTimeout != want {
			t.Errorf("QUOTA_GRPC_HANDSHAKE_TIMEOUT=%q: %v, %v; want %v", v, c.GRPCHandshakeTimeout, err, want)
		}
	}
	if _, err := config.LoadAPI(env(map[string]string{"QUOTA_GRPC_HANDSHAKE_TIMEOUT": "0s"})); err == nil ||
		!strings.Contains(err.Error(), "QUOTA_GRPC_HANDSHAKE_TIMEOUT") {
		t.Errorf("QUOTA_GRPC_HANDSHAKE_TIMEOUT=0s: %v", err)
	}
	// RLQS streams: defaults, values, and an assignment's life of at most 10 s.
	if c, err := config.LoadAPI(env(nil)); err != nil || c.RLQSAssignmentLife != 2*time.Second || c.RLQSMaxBuckets != 1024 ||
		c.RLQSIdleTimeout != 5*time.Minute || c.RLQSReportLag != 250*time.Millisecond {
		t.Errorf("RLQS by default: %v %d %v %v, %v", c.RLQSAssignmentLife, c.RLQSMaxBuckets, c.RLQSIdleTimeout, c.RLQSReportLag, err)
	}
	if c, err := config.LoadAPI(env(map[string]string{"QUOTA_RLQS_ASSIGNMENT_LIFE": "5s", "QUOTA_RLQS_MAX_BUCKETS": "64",
		"QUOTA_RLQS_IDLE_TIMEOUT": "1m", "QUOTA_RLQS_REPORT_LAG": "1s"})); err != nil || c.RLQSAssignmentLife != 5*time.Second ||
		c.RLQSMaxBuckets != 64 || c.RLQSIdleTimeout != time.Minute || c.RLQSReportLag != time.Second {
		t.Errorf("RLQS set: %+v, %v", c, err)
	}
	if _, err := config.LoadAPI(env(map[string]string{"QUOTA_RLQS_ASSIGNMENT_LIFE": "11s", "QUOTA_RLQS_MAX_BUCKETS": "0"})); err == nil ||
		!strings.Contains(err.Error(), "QUOTA_RLQS_ASSIGNMENT_LIFE") || !strings.Contains(err.Error(), "QUOTA_RLQS_MAX_BUCKETS") {
		t.Errorf("an assignment life of 11s, 0 buckets: %v", err)
	}
	// Stream workers, 128 by default; "off" or 0 is a goroutine per call.
	if c, _ := config.LoadAPI(env(nil)); c.GRPCStreamWorkers != 128 {
		t.Errorf("stream workers by default: %d, want 128", c.GRPCStreamWorkers)
	}
	for v, want := range map[string]int{"off": -1, "0": -1, "16": 16} {
		if c, err := config.LoadAPI(env(map[string]string{"QUOTA_GRPC_STREAM_WORKERS": v})); err != nil || c.GRPCStreamWorkers != want {
			t.Errorf("QUOTA_GRPC_STREAM_WORKERS=%s: %d, %v; want %d", v, c.GRPCStreamWorkers, err, want)
		}
	}
	if _, err := config.LoadAPI(env(map[string]string{"QUOTA_GRPC_STREAM_WORKERS": "many"})); err == nil ||
		!strings.Contains(err.Error(), "QUOTA_GRPC_STREAM_WORKERS") {
		t.Errorf("QUOTA_GRPC_STREAM_WORKERS=many: %v", err)
	}
}
