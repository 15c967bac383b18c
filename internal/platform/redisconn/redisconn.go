// Package redisconn parses the Redis addresses of Quotaplane's configuration and
// builds clients for them: a single server from a redis:// URL, or a Redis Cluster
// from a comma-separated seed list, a URL with cluster=true, or REDIS_CLUSTER=true.
package redisconn

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/redact"
)

// Options is a parsed Redis address: exactly one of Single and Cluster is set.
type Options struct {
	Single  *redis.Options
	Cluster *redis.ClusterOptions
}

// IsCluster reports whether s names a Redis Cluster by itself: a comma-separated seed
// list, or a URL whose query has cluster=true.
func IsCluster(s string) bool {
	if strings.Contains(s, ",") {
		return true
	}
	if i := strings.IndexByte(s, '?'); i >= 0 {
		q, err := url.ParseQuery(s[i+1:])
		return err == nil && q.Get("cluster") == "true"
	}
	return false
}

// Parse parses s. It is a cluster when cluster is set or IsCluster(s):
//   - a seed list "host:port,host:port" or "redis://host:port,redis://host:port";
//   - a URL "redis://[user:pass@]host:port?cluster=true[&addr=host:port...]", whose
//     addr parameters are further seeds and whose other parameters are go-redis's
//     cluster URL options.
//
// Otherwise s is a redis:// or rediss:// URL of one server.
func Parse(s string, cluster bool) (Options, error) {
	s = strings.TrimSpace(s)
	if !cluster && !IsCluster(s) {
		opt, err := redis.ParseURL(s)
		if err != nil {
			return Options{}, err
		}
		return Options{Single: opt}, nil
	}
	seeds := strings.Split(s, ",")
	first := strings.TrimSpace(seeds[0])
	if !strings.Contains(first, "://") {
		first = "redis://" + first
	}
	u, err := url.Parse(first)
	if err != nil {
		return Options{}, fmt.Errorf("cluster seed %q: %w", seeds[0], err)
	}
	q := u.Query()
	q.Del("cluster")
	for _, seed := range seeds[1:] {
		seed = strings.TrimSpace(seed)
		if seed == "" {
			continue
		}
		if i := strings.Index(seed, "://"); i >= 0 {
			seed = seed[i+3:]
		}
		if at := strings.LastIndexByte(seed, '@'); at >= 0 {
			seed = seed[at+1:]
		}
		seed = strings.TrimRight(seed, "/")
		if slash := strings.IndexByte(seed, '/'); slash >= 0 {
			seed = seed[:slash]
		}
		if seed == "" || !strings.Contains(seed, ":") {
			return Options{}, fmt.Errorf("cluster seed %q is not host:port", seed)
		}
		q.Add("addr", seed)
	}
	u.RawQuery = q.Encode()
	if u.Host == "" {
		return Options{}, errors.New("no cluster seed")
	}
	opt, err := redis.ParseClusterURL(u.String())
	if err != nil {
		return Options{}, err
	}
	return Options{Cluster: opt}, nil
}

// Client builds the client o describes.
func (o Options) Client() redis.UniversalClient {
	if o.Cluster != nil {
		return redis.NewClusterClient(o.Cluster)
	}
	return redis.NewClient(o.Single)
}

// New returns a client for s (see Parse). Errors name REDIS_URL, the variable s
// comes from, without the password.
func New(s string, cluster bool) (redis.UniversalClient, error) {
	o, err := Parse(s, cluster)
	if err != nil { // not wrapped: url.Parse's message quotes the URL, password and all
		return nil, fmt.Errorf("REDIS_URL: %s", redact.Error(err, s))
	}
	return o.Client(), nil
}

// Canonical returns s in a form that names a cluster by itself when cluster is set
// (REDIS_CLUSTER=true with a single seed URL gets cluster=true), so that every
// component that parses it later, without the flag, agrees.
func Canonical(s string, cluster bool) string {
	s = strings.TrimSpace(s)
	if !cluster || IsCluster(s) {
		return s
	}
	if !strings.Contains(s, "://") {
		s = "redis://" + s
	}
	if strings.Contains(s, "?") {
		return s + "&cluster=true"
	}
	return s + "?cluster=true"
}
