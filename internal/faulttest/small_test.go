package faulttest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// startOneReplica starts the reproductions' small cluster: one api replica and the
// worker, built without -race, on a private redis-server and a fresh database, with a
// 250 ms flush and a 200 ms reservation sweep, the org set up as the schedule sets it.
// It returns the cluster, the org's key and a client of the private Redis; all three
// are stopped when the test ends.
func startOneReplica(t *testing.T) (*cluster, string, *redis.Client) {
	t.Helper()
	ctx := context.Background()
	apiBin, workerBin, err := buildBinaries(ctx, testenv.RepoRoot(t), t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := startCluster(clusterConfig{APIBin: apiBin, WorkerBin: workerBin, DatabaseURL: testenv.PostgresURL(t), Replicas: 1,
		FlushInterval: 250 * time.Millisecond, Sweep: 200 * time.Millisecond, freePort: func() int { return testenv.FreePort(t) }, Logf: t.Logf})
	t.Cleanup(c.stop)
	if err != nil {
		t.Fatalf("start: %v\n%s", err, c.logs())
	}
	key, period, err := setup(ctx, c, teamLimit(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	c.period = period
	rdb := redis.NewClient(&redis.Options{Addr: c.redis.addr()})
	t.Cleanup(func() { rdb.Close() })
	return c, key, rdb
}
