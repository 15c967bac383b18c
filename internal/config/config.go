package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/forwarded"
	"github.com/quotaplane/quotaplane/internal/platform/redact"
)

// Defaults of API.md "Running".
const (
	DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/quotaplane?sslmode=disable"
	DefaultRedisURL    = "redis://127.0.0.1:6379/0"
	DefaultHTTPAddr    = "127.0.0.1:8080"
	DefaultWorkerAddr  = "127.0.0.1:8081"
	DefaultGRPCAddr    = "127.0.0.1:8082"
	// DefaultMetricsAddr is QUOTA_METRICS_ADDR's default: the api's /metrics on
	// loopback, never beside the public API unless asked.
	DefaultMetricsAddr = "127.0.0.1:8083"
)

// Common is what both binaries read.
type Common struct {
	DatabaseURL string // DATABASE_URL
	// RedisURL is a redis:// URL, or a comma-separated list of host:port seeds of a
	// Redis Cluster (REDIS_URL).
	RedisURL     string
	RedisCluster bool // REDIS_CLUSTER, or implied by a seed list
	// RedisPrefix (QUOTA_REDIS_PREFIX, default "q") starts every Redis key of the
	// install (quota.Config.KeyPrefix) and names its cache invalidation channel
	// (tenants.ChannelFor), so two installs sharing a Redis keep apart. The api and
	// the worker must agree on it.
	RedisPrefix    string
	AdminToken     string        // QUOTA_ADMIN_TOKEN; empty disables the operator API
	LogLevel       slog.Level    // QUOTA_LOG_LEVEL: debug, info, warn, error
	StartupTimeout time.Duration // QUOTA_STARTUP_TIMEOUT: how long to wait for Postgres at start
	// FaultClock (QUOTA_FAULT_CLOCK: on or off, default off) is a test hook: SIGUSR1 and
	// SIGUSR2 step the engines' wall clock by +2 s and -2 s (internal/platform/faultclock).
	FaultClock bool
}

// API configures quotaplane-api.
type API struct {
	Common
	HTTPAddr string // QUOTA_HTTP_ADDR
	// GRPCAddr (QUOTA_GRPC_ADDR, default 127.0.0.1:8082) serves Envoy's rate limit
	// service; "off" leaves it empty: no gRPC listener.
	GRPCAddr string
	// GRPCAliases (QUOTA_GRPC_DESCRIPTOR_ALIASES, "x-user-id=user,tenant-team=team")
	// lets descriptor entries use other keys for org, team, user and metric.
	GRPCAliases map[string]string
	// RedisPools maps a plan's pool class to its Redis (QUOTA_REDIS_POOLS,
	// "free=redis://a:6379/0,pro=redis://b:6379/0"); classes not named use REDIS_URL.
	RedisPools        map[string]string
	MaxInFlightPerOrg int // QUOTA_MAX_INFLIGHT_PER_ORG: checks of one org at once, 256
	Replicas          int // QUOTA_REPLICAS: api replicas, sizes the local fail mode's share and a lease's share of the headroom, 1
	// Leases (QUOTA_LEASES, true) lets a hot path's checks be admitted in process from a
	// lease; plans and orgs may still switch them off. LeaseMax (QUOTA_LEASE_MAX, 250ms)
	// bounds a lease's life: a replica that dies has its leases committed whole (counted
	// as used) after LeaseMax + 1 s + the worker's QUOTA_RESERVATION_SWEEP.
	Leases       bool
	LeaseMax     time.Duration
	RedisTimeout time.Duration // QUOTA_REDIS_TIMEOUT: dial/read/write timeout of check traffic, 100ms
	// MetricsOrgs (QUOTA_METRICS_ORGS, 100) is how many orgs get their own series in
	// quotaplane_org_checks_total on each replica; the rest are counted as "_other".
	// 0 gives every org "_other".
	MetricsOrgs int
	// WebhookSecret (QUOTA_WEBHOOK_SECRET, the worker's value) lets the api show each
	// org its webhook signing secret (GET /v1/orgs/{org}/webhook); unset: it shows none.
	WebhookSecret string
	// WebhookAllowPrivate (QUOTA_WEBHOOK_ALLOW_PRIVATE, the worker's value) lets a test
	// webhook (POST /v1/orgs/{org}/webhook/test) reach loopback, private and link-local
	// addresses: for tests and local development only.
	WebhookAllowPrivate bool
	// PprofAddr (QUOTA_PPROF_ADDR) serves net/http/pprof on its own listener, which must
	// be a loopback address; empty (the default) serves no profiles at all.
	PprofAddr string
	// AdminRateLimit requests per AdminRateWindow are allowed to each credential on
	// every /v1 route but the checks (QUOTA_ADMIN_RATE_LIMIT: "20/s", "600/m", "5000/h";
	// default 50/s; "0" or "off" sets AdminRateLimit to 0, no limit).
	AdminRateLimit  int
	AdminRateWindow time.Duration
	// CacheOrgs, CacheUsers and CacheKeys bound the api's resolved-tenancy cache in
	// entries (QUOTA_CACHE_ORGS, default 1000000; QUOTA_CACHE_USERS, registered users
	// carried by the cached orgs, 200000; QUOTA_CACHE_KEYS, API keys, 500000), and
	// CacheMemoryMB (QUOTA_CACHE_MEMORY_MB, default 512) the estimated memory of the
	// resolved orgs, which binds first: orgs differ in size, so memory, not a count,
	// sizes the cache.
	CacheOrgs, CacheUsers, CacheKeys int
	CacheMemoryMB                    int
	// RateLimitHeaders (QUOTA_RATELIMIT_HEADERS: both, draft, legacy or off; default
	// both) says which RateLimit header fields the checks, reservations and Envoy's
	// response_headers_to_add carry: the IETF draft-11's RateLimit-Policy and
	// RateLimit, the legacy (draft-06) RateLimit-Limit, -Remaining and -Reset, both or
	// neither. Lower case; checks.ParseHeaderMode reads it.
	RateLimitHeaders string
	// Shared Redis bounds (SECURITY.md "Shared Redis bounds"): the most idempotency
	// records one org holds (QUOTA_IDEMPOTENCY_RECORDS, default 100000) and the most
	// distinct unregistered users one org names in a billing period
	// (QUOTA_UNREGISTERED_USERS, default 100000); "off" (or 0) is no bound (-1 here, as
	// quota.Config reads it).
	IdempotencyRecords int64
	UnregisteredUsers  int64
	// gRPC transport: GRPCTLSCert and GRPCTLSKey (QUOTA_GRPC_TLS_CERT,
	// QUOTA_GRPC_TLS_KEY: PEM files, both or neither) serve TLS; GRPCMaxStreams
	// (QUOTA_GRPC_MAX_STREAMS, 1024) bounds a connection's concurrent calls;
	// GRPCKeepaliveMinTime (QUOTA_GRPC_KEEPALIVE_MIN_TIME, 10s) is the shortest ping
	// interval a client may use before it is disconnected (rls.Limits);
	// GRPCStreamWorkers (QUOTA_GRPC_STREAM_WORKERS, 128; "off" or 0: a goroutine per
	// call) the goroutines kept to run calls (rls.Limits.StreamWorkers);
	// GRPCHandshakeTimeout (QUOTA_GRPC_HANDSHAKE_TIMEOUT, 5s) closes a connection that
	// has not finished its TLS handshake and HTTP/2 preface by then.
	GRPCTLSCert, GRPCTLSKey string
	GRPCStreamWorkers       int
	GRPCMaxStreams          int
	GRPCKeepaliveMinTime    time.Duration
	GRPCHandshakeTimeout    time.Duration
	// RLQS bounds Envoy's rate limit quota streams (rls.RLQSLimits):
	// QUOTA_RLQS_ASSIGNMENT_LIFE (2s, at most 10s) the longest TTL of an assignment,
	// QUOTA_RLQS_MAX_BUCKETS (1024) the buckets one stream watches,
	// QUOTA_RLQS_IDLE_TIMEOUT (5m) when a silent stream is closed, QUOTA_RLQS_REPORT_LAG
	// (250ms) the time a report has to arrive after an assignment's end.
	RLQSAssignmentLife, RLQSIdleTimeout, RLQSReportLag time.Duration
	RLQSMaxBuckets                                     int
	Hardening
}

// Hardening is the api's bounds on what a caller can make it do and see (SECURITY.md,
// docs/CONFIGURATION.md).
type Hardening struct {
	// MetricsAddr (QUOTA_METRICS_ADDR, default 127.0.0.1:8083) serves the api's
	// /metrics on a listener of its own; "public" serves it on QUOTA_HTTP_ADDR beside
	// the API instead (MetricsPublic), "off" nowhere.
	MetricsAddr   string
	MetricsPublic bool
	// TrustedProxies (QUOTA_TRUSTED_PROXIES: addresses and CIDR prefixes) are the
	// proxies whose X-Forwarded-For and X-Forwarded-Proto the console believes.
	TrustedProxies forwarded.Proxies
	// ConsoleSecureCookies (QUOTA_CONSOLE_SECURE_COOKIES: on or off, default off)
	// makes the session cookie Secure and __Host- on every request; off, only on
	// requests that reached the api over HTTPS (directly or per TrustedProxies).
	ConsoleSecureCookies bool
	// PasswordHashes (QUOTA_PASSWORD_HASHES, default tenants.DefaultPasswordHashes:
	// half the CPUs, 1 to 4) bounds the argon2id hashes running at once, 19 MiB each.
	PasswordHashes int
	// SignInRate per SignInWindow (QUOTA_SIGNIN_RATE_LIMIT, default 10/s) bounds this
	// replica's sign-ins; SignInIPRate per SignInIPWindow (QUOTA_SIGNIN_IP_RATE_LIMIT,
	// default 30/m) those of one client address. Neither can be turned off.
	SignInRate, SignInIPRate     int
	SignInWindow, SignInIPWindow time.Duration
	// AdminOrgRateLimit per AdminOrgRateWindow (QUOTA_ADMIN_ORG_RATE_LIMIT, default
	// 100/s, "off" for none) is the admin rate limit of one org, all its credentials
	// together, beside QUOTA_ADMIN_RATE_LIMIT's per credential.
	AdminOrgRateLimit  int
	AdminOrgRateWindow time.Duration
	// MaxKeysPerOrg (QUOTA_MAX_KEYS_PER_ORG, default 100) caps an org's active API keys.
	MaxKeysPerOrg int
}

// hardening reads the api's Hardening settings.
func (r *reader) hardening() Hardening {
	h := Hardening{ConsoleSecureCookies: r.onOff("QUOTA_CONSOLE_SECURE_COOKIES"),
		PasswordHashes: r.integer("QUOTA_PASSWORD_HASHES", 0, 1),
		MaxKeysPerOrg:  r.integer("QUOTA_MAX_KEYS_PER_ORG", 100, 1)}
	switch v := strings.ToLower(r.str("QUOTA_METRICS_ADDR", DefaultMetricsAddr)); v {
	case "off":
	case "public":
		h.MetricsPublic = true
	default:
		h.MetricsAddr = r.addr("QUOTA_METRICS_ADDR", DefaultMetricsAddr)
	}
	var err error
	if h.TrustedProxies, err = forwarded.Parse(r.getenv("QUOTA_TRUSTED_PROXIES")); err != nil {
		r.errs = append(r.errs, fmt.Errorf("QUOTA_TRUSTED_PROXIES: %w", err))
	}
	h.SignInRate, h.SignInWindow = r.rate("QUOTA_SIGNIN_RATE_LIMIT", 10, time.Second)
	h.SignInIPRate, h.SignInIPWindow = r.rate("QUOTA_SIGNIN_IP_RATE_LIMIT", 30, time.Minute)
	for _, l := range []struct {
		key string
		n   int
	}{{"QUOTA_SIGNIN_RATE_LIMIT", h.SignInRate}, {"QUOTA_SIGNIN_IP_RATE_LIMIT", h.SignInIPRate}} {
		if l.n <= 0 {
			r.errs = append(r.errs, fmt.Errorf("%s: sign-ins cannot go unlimited (each hashes a password: 19 MiB and tens of ms of CPU); give a rate such as 10/s", l.key))
		}
	}
	h.AdminOrgRateLimit, h.AdminOrgRateWindow = r.rate("QUOTA_ADMIN_ORG_RATE_LIMIT", 100, time.Second)
	return h
}

// LogValue prints the settings.
func (h Hardening) LogValue() slog.Value {
	metrics := h.MetricsAddr
	if h.MetricsPublic {
		metrics = "public"
	} else if metrics == "" {
		metrics = "off"
	}
	return slog.GroupValue(slog.String("metrics_addr", metrics), slog.String("trusted_proxies", h.TrustedProxies.String()),
		slog.Bool("console_secure_cookies", h.ConsoleSecureCookies), slog.Int("password_hashes", h.PasswordHashes),
		slog.String("signin_rate_limit", rateString(h.SignInRate, h.SignInWindow)),
		slog.String("signin_ip_rate_limit", rateString(h.SignInIPRate, h.SignInIPWindow)),
		slog.String("admin_org_rate_limit", rateString(h.AdminOrgRateLimit, h.AdminOrgRateWindow)),
		slog.Int("max_keys_per_org", h.MaxKeysPerOrg))
}

// RateLimitHeaderValues are QUOTA_RATELIMIT_HEADERS's values.
var RateLimitHeaderValues = []string{"both", "draft", "legacy", "off"}

// Worker configures quotaplane-worker.
type Worker struct {
	Common
	HTTPAddr      string        // QUOTA_WORKER_HTTP_ADDR: /healthz and /metrics
	FlushInterval time.Duration // QUOTA_FLUSH_INTERVAL
	// ReservationSweep (QUOTA_RESERVATION_SWEEP, default 500ms) is how often the worker
	// settles reservations past their expiry.
	ReservationSweep time.Duration
	// RedisPools is the api's QUOTA_REDIS_POOLS: the worker reads each org's live
	// counters where the api counts them.
	RedisPools map[string]string
	// WebhookSecret (QUOTA_WEBHOOK_SECRET) derives each org's webhook signing secret;
	// without it events are recorded but no webhook is sent.
	WebhookSecret string
	// WebhookAllowPrivate (QUOTA_WEBHOOK_ALLOW_PRIVATE) lets webhooks reach loopback,
	// private and link-local addresses: for tests and local development only.
	WebhookAllowPrivate bool
	// CloseGrace (QUOTA_CLOSE_GRACE) is how long after a period's end it is closed.
	CloseGrace time.Duration
	// CacheOrgs (QUOTA_CACHE_ORGS, default 10000) bounds the orgs whose limits the
	// flusher keeps for its threshold events.
	CacheOrgs int
}

type reader struct {
	getenv func(string) string
	errs   []error
}

func (r *reader) str(key, def string) string {
	if v := strings.TrimSpace(r.getenv(key)); v != "" {
		return v
	}
	return def
}

func (r *reader) boolean(key string, def bool) bool {
	v := r.getenv(key)
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want true or false", key, v))
	}
	return b
}

// onOff reads a switch that is off unless set to "on".
func (r *reader) onOff(key string) bool {
	switch v := strings.ToLower(strings.TrimSpace(r.getenv(key))); v {
	case "", "off":
		return false
	case "on":
		return true
	}
	r.errs = append(r.errs, fmt.Errorf("%s=%q: want on or off", key, r.getenv(key)))
	return false
}

func (r *reader) duration(key string, def time.Duration) time.Duration {
	v := r.getenv(key)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want a positive duration such as 2s", key, v))
	}
	return d
}

func (r *reader) integer(key string, def, lo int) int {
	v := r.getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want a whole number >= %d", key, v, lo))
	}
	return n
}

func (r *reader) addr(key, def string) string {
	v := r.str(key, def)
	if _, _, err := net.SplitHostPort(v); err != nil {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want host:port", key, v))
	}
	return v
}

// webhookSecret reads QUOTA_WEBHOOK_SECRET, which both binaries must agree on.
func (r *reader) webhookSecret() string {
	v := r.getenv("QUOTA_WEBHOOK_SECRET")
	if v != "" && len(v) < 16 {
		r.errs = append(r.errs, errors.New("QUOTA_WEBHOOK_SECRET: use at least 16 characters (or leave it unset to send no webhooks)"))
	}
	return v
}

// DefaultRedisPrefix is QUOTA_REDIS_PREFIX's default: the prefix every key had
// before it could be set.
const DefaultRedisPrefix = "q"

// redisPrefix reads QUOTA_REDIS_PREFIX: 1 to 32 letters, digits, '-', '_' or '.'
// (none of the key syntax's '{', '}', '|' or ':').
func (r *reader) redisPrefix() string {
	v := r.str("QUOTA_REDIS_PREFIX", DefaultRedisPrefix)
	ok := len(v) <= 32
	for _, c := range v {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			ok = false
		}
	}
	if !ok {
		r.errs = append(r.errs, fmt.Errorf("QUOTA_REDIS_PREFIX=%q: want 1 to 32 letters, digits, '-', '_' or '.'", v))
	}
	return v
}

func (r *reader) common() Common {
	c := Common{
		DatabaseURL:    r.str("DATABASE_URL", DefaultDatabaseURL),
		RedisURL:       r.str("REDIS_URL", DefaultRedisURL),
		RedisCluster:   r.boolean("REDIS_CLUSTER", false),
		RedisPrefix:    r.redisPrefix(),
		AdminToken:     r.getenv("QUOTA_ADMIN_TOKEN"),
		StartupTimeout: r.duration("QUOTA_STARTUP_TIMEOUT", 60*time.Second),
		FaultClock:     r.onOff("QUOTA_FAULT_CLOCK"),
	}
	if strings.Contains(c.RedisURL, ",") {
		c.RedisCluster = true
	}
	if err := c.LogLevel.UnmarshalText([]byte(r.str("QUOTA_LOG_LEVEL", "info"))); err != nil {
		r.errs = append(r.errs, fmt.Errorf("QUOTA_LOG_LEVEL: %w", err))
	}
	if c.AdminToken != "" && len(c.AdminToken) < 16 {
		r.errs = append(r.errs, errors.New("QUOTA_ADMIN_TOKEN: use at least 16 characters (or leave it unset to disable the operator API)"))
	}
	return c
}

// LoadAPI reads the api's configuration through getenv (os.Getenv in production).
func LoadAPI(getenv func(string) string) (API, error) {
	r := &reader{getenv: getenv}
	c := API{Common: r.common(), HTTPAddr: r.addr("QUOTA_HTTP_ADDR", DefaultHTTPAddr),
		MaxInFlightPerOrg:   r.integer("QUOTA_MAX_INFLIGHT_PER_ORG", 256, 1),
		Replicas:            r.integer("QUOTA_REPLICAS", 1, 1),
		Leases:              r.boolean("QUOTA_LEASES", true),
		LeaseMax:            r.duration("QUOTA_LEASE_MAX", 250*time.Millisecond),
		RedisTimeout:        r.duration("QUOTA_REDIS_TIMEOUT", 100*time.Millisecond),
		MetricsOrgs:         r.integer("QUOTA_METRICS_ORGS", 100, 0),
		WebhookSecret:       r.webhookSecret(),
		WebhookAllowPrivate: r.boolean("QUOTA_WEBHOOK_ALLOW_PRIVATE", false),
		PprofAddr:           r.loopback("QUOTA_PPROF_ADDR"),
		CacheOrgs:           r.integer("QUOTA_CACHE_ORGS", 1_000_000, 1),
		CacheUsers:          r.integer("QUOTA_CACHE_USERS", 200_000, 10),
		CacheKeys:           r.integer("QUOTA_CACHE_KEYS", 500_000, 1),
		CacheMemoryMB:       r.integer("QUOTA_CACHE_MEMORY_MB", 512, 1),
	}
	c.AdminRateLimit, c.AdminRateWindow = r.rate("QUOTA_ADMIN_RATE_LIMIT", 50, time.Second)
	c.Hardening = r.hardening()
	c.IdempotencyRecords = r.bound("QUOTA_IDEMPOTENCY_RECORDS", 100_000)
	c.UnregisteredUsers = r.bound("QUOTA_UNREGISTERED_USERS", 100_000)
	c.GRPCTLSCert, c.GRPCTLSKey = strings.TrimSpace(getenv("QUOTA_GRPC_TLS_CERT")), strings.TrimSpace(getenv("QUOTA_GRPC_TLS_KEY"))
	if (c.GRPCTLSCert == "") != (c.GRPCTLSKey == "") {
		r.errs = append(r.errs, errors.New("QUOTA_GRPC_TLS_CERT and QUOTA_GRPC_TLS_KEY: set both (PEM files) or neither"))
	}
	c.GRPCMaxStreams = r.integer("QUOTA_GRPC_MAX_STREAMS", 1024, 1)
	c.GRPCKeepaliveMinTime = r.duration("QUOTA_GRPC_KEEPALIVE_MIN_TIME", 10*time.Second)
	c.GRPCHandshakeTimeout = r.duration("QUOTA_GRPC_HANDSHAKE_TIMEOUT", 5*time.Second)
	c.RLQSAssignmentLife = r.duration("QUOTA_RLQS_ASSIGNMENT_LIFE", 2*time.Second)
	if c.RLQSAssignmentLife > 10*time.Second {
		r.errs = append(r.errs, fmt.Errorf("QUOTA_RLQS_ASSIGNMENT_LIFE=%q: want at most 10s", getenv("QUOTA_RLQS_ASSIGNMENT_LIFE")))
	}
	c.RLQSMaxBuckets = r.integer("QUOTA_RLQS_MAX_BUCKETS", 1024, 1)
	c.RLQSIdleTimeout = r.duration("QUOTA_RLQS_IDLE_TIMEOUT", 5*time.Minute)
	c.RLQSReportLag = r.duration("QUOTA_RLQS_REPORT_LAG", 250*time.Millisecond)
	if v := strings.TrimSpace(getenv("QUOTA_GRPC_STREAM_WORKERS")); strings.EqualFold(v, "off") || v == "0" {
		c.GRPCStreamWorkers = -1
	} else {
		c.GRPCStreamWorkers = r.integer("QUOTA_GRPC_STREAM_WORKERS", 128, 1)
	}
	c.RateLimitHeaders = strings.ToLower(strings.TrimSpace(r.str("QUOTA_RATELIMIT_HEADERS", "both")))
	if !slices.Contains(RateLimitHeaderValues, c.RateLimitHeaders) {
		r.errs = append(r.errs, fmt.Errorf("QUOTA_RATELIMIT_HEADERS=%q: want both, draft, legacy or off", r.getenv("QUOTA_RATELIMIT_HEADERS")))
		c.RateLimitHeaders = "both"
	}
	pools, err := ParsePools(getenv("QUOTA_REDIS_POOLS"))
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("QUOTA_REDIS_POOLS: %w", err))
	}
	c.RedisPools = pools
	if c.GRPCAddr = r.str("QUOTA_GRPC_ADDR", DefaultGRPCAddr); strings.EqualFold(c.GRPCAddr, "off") {
		c.GRPCAddr = ""
	} else {
		c.GRPCAddr = r.addr("QUOTA_GRPC_ADDR", DefaultGRPCAddr)
	}
	if c.GRPCAliases, err = ParseAliases(getenv("QUOTA_GRPC_DESCRIPTOR_ALIASES")); err != nil {
		r.errs = append(r.errs, fmt.Errorf("QUOTA_GRPC_DESCRIPTOR_ALIASES: %w", err))
	}
	return c, errors.Join(r.errs...)
}

// bound reads a bound on what an org may hold: a whole number >= 1, or "off" or 0 for
// none (-1).
func (r *reader) bound(key string, def int64) int64 {
	v := strings.ToLower(strings.TrimSpace(r.getenv(key)))
	switch v {
	case "":
		return def
	case "0", "off":
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want a whole number >= 1, or off", key, r.getenv(key)))
		return def
	}
	return n
}

// rate reads a rate limit "<requests>/<s|m|h>"; "0" or "off" is no limit (0 requests).
func (r *reader) rate(key string, def int, defWindow time.Duration) (int, time.Duration) {
	v := strings.ToLower(strings.TrimSpace(r.getenv(key)))
	switch v {
	case "":
		return def, defWindow
	case "0", "off":
		return 0, defWindow
	}
	num, unit, ok := strings.Cut(v, "/")
	n, err := strconv.Atoi(strings.TrimSpace(num))
	window, known := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}[strings.TrimSpace(unit)]
	if !ok || err != nil || n < 1 || !known {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want requests per second, minute or hour such as 20/s or 600/m, or off", key, r.getenv(key)))
		return def, defWindow
	}
	return n, window
}

// loopback reads an optional host:port that must be on a loopback interface: profiles
// show request data and cost CPU to take, so they are never served to the network.
func (r *reader) loopback(key string) string {
	v := r.str(key, "")
	if v == "" {
		return ""
	}
	host, _, err := net.SplitHostPort(v)
	ip := net.ParseIP(host)
	if err != nil || (host != "localhost" && (ip == nil || !ip.IsLoopback())) {
		r.errs = append(r.errs, fmt.Errorf("%s=%q: want a loopback host:port such as 127.0.0.1:6060", key, v))
	}
	return v
}

// LoadWorker reads the worker's configuration through getenv.
func LoadWorker(getenv func(string) string) (Worker, error) {
	r := &reader{getenv: getenv}
	c := Worker{
		Common:              r.common(),
		HTTPAddr:            r.addr("QUOTA_WORKER_HTTP_ADDR", DefaultWorkerAddr),
		FlushInterval:       r.duration("QUOTA_FLUSH_INTERVAL", 2*time.Second),
		ReservationSweep:    r.duration("QUOTA_RESERVATION_SWEEP", 500*time.Millisecond),
		WebhookSecret:       r.webhookSecret(),
		WebhookAllowPrivate: r.boolean("QUOTA_WEBHOOK_ALLOW_PRIVATE", false),
		CloseGrace:          r.duration("QUOTA_CLOSE_GRACE", time.Minute),
		CacheOrgs:           r.integer("QUOTA_CACHE_ORGS", 10_000, 1),
	}
	pools, err := ParsePools(getenv("QUOTA_REDIS_POOLS"))
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("QUOTA_REDIS_POOLS: %w", err))
	}
	c.RedisPools = pools
	return c, errors.Join(r.errs...)
}

func rateString(n int, per time.Duration) string {
	if n <= 0 {
		return "off"
	}
	return strconv.Itoa(n) + "/" + map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[per]
}

func mask(secret string) string {
	if secret == "" {
		return "(unset)"
	}
	return "(set, " + strconv.Itoa(len(secret)) + " chars)"
}

// LogValue prints the configuration with secrets masked.
func (c Common) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("database_url", redact.URL(c.DatabaseURL)),
		slog.String("redis_url", redact.URL(c.RedisURL)),
		slog.Bool("redis_cluster", c.RedisCluster),
		slog.String("redis_prefix", c.RedisPrefix),
		slog.String("admin_token", mask(c.AdminToken)),
		slog.String("log_level", c.LogLevel.String()),
		slog.Bool("fault_clock", c.FaultClock),
	)
}

// LogValue prints the configuration with secrets masked.
func (c API) LogValue() slog.Value {
	pools := make([]string, 0, len(c.RedisPools))
	for class, u := range c.RedisPools {
		pools = append(pools, class+"="+redact.URL(u))
	}
	aliases := make([]string, 0, len(c.GRPCAliases))
	for a, k := range c.GRPCAliases {
		aliases = append(aliases, a+"="+k)
	}
	return slog.GroupValue(slog.Any("common", c.Common), slog.String("http_addr", c.HTTPAddr),
		slog.String("grpc_addr", c.GRPCAddr), slog.Any("grpc_descriptor_aliases", aliases),
		slog.Any("redis_pools", pools), slog.Int("max_inflight_per_org", c.MaxInFlightPerOrg), slog.Int("metrics_orgs", c.MetricsOrgs),
		slog.Int("replicas", c.Replicas), slog.Duration("redis_timeout", c.RedisTimeout),
		slog.Bool("leases", c.Leases), slog.Duration("lease_max", c.LeaseMax),
		slog.String("webhook_secret", mask(c.WebhookSecret)), slog.Bool("webhook_allow_private", c.WebhookAllowPrivate),
		slog.String("pprof_addr", c.PprofAddr),
		slog.String("admin_rate_limit", rateString(c.AdminRateLimit, c.AdminRateWindow)),
		slog.String("ratelimit_headers", c.RateLimitHeaders),
		slog.Int("cache_orgs", c.CacheOrgs), slog.Int("cache_users", c.CacheUsers), slog.Int("cache_keys", c.CacheKeys),
		slog.Any("hardening", c.Hardening))
}

// LogValue prints the configuration with secrets masked.
func (c Worker) LogValue() slog.Value {
	pools := make([]string, 0, len(c.RedisPools))
	for class, u := range c.RedisPools {
		pools = append(pools, class+"="+redact.URL(u))
	}
	return slog.GroupValue(slog.Any("common", c.Common), slog.String("http_addr", c.HTTPAddr),
		slog.Duration("flush_interval", c.FlushInterval), slog.Any("redis_pools", pools),
		slog.String("webhook_secret", mask(c.WebhookSecret)), slog.Bool("webhook_allow_private", c.WebhookAllowPrivate),
		slog.Duration("close_grace", c.CloseGrace), slog.Int("cache_orgs", c.CacheOrgs))
}
