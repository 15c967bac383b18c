package quota

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// BenchmarkOrgKeys looks up the shared keys of 1,000 orgs from concurrent checks: the
// key cache on the hot path of every check, without Redis.
func BenchmarkOrgKeys(b *testing.B) {
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opt, err := ClientOptions(url)
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	e, err := New(rdb, Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	orgs := make([]string, 1000)
	for i := range orgs {
		orgs[i] = fmt.Sprintf("org-%d", i)
	}
	per := e.Period(1)
	var next atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if e.orgKeys(orgs[next.Add(1)%int64(len(orgs))], per) == nil {
				b.Error("no keys")
			}
		}
	})
}
