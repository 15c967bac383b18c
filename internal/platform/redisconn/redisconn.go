// Package redisconn builds the Redis client both binaries use from REDIS_URL: a
// single server from a redis:// URL, or a Redis Cluster from a comma-separated seed
// list (or REDIS_CLUSTER=true).
package redisconn

import (
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// New returns a client for url. With cluster set, url is either a seed list
// "host:port,host:port" or a single redis:// URL naming one seed.
func New(url string, cluster bool) (redis.UniversalClient, error) {
	if !cluster {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		return redis.NewClient(opt), nil
	}
	if strings.Contains(url, "://") {
		opt, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		return redis.NewClusterClient(opt), nil
	}
	var addrs []string
	for _, a := range strings.Split(url, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("REDIS_URL: no cluster seeds in %q", url)
	}
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}), nil
}
