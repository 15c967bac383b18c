package quota_test

import (
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

func TestScratchWeights(t *testing.T) {
	rs := replicas(t, 2)
	c := quota.Capacity{ID: "gpu", Metric: "tokens", Window: vocab.Second, Limit: 200}
	base := time.Now()
	sec := time.Second.Microseconds()
	var a, b []admission
	var wg sync.WaitGroup
	wg.Go(func() { a = flood(t, rs, capReq("free", c, 1), 4, base, base.Add(6*time.Second)) })
	wg.Go(func() { b = flood(t, rs, capReq("pro", c, 3), 4, base, base.Add(6*time.Second)) })
	wg.Wait()
	for w := int64(0); w < 6; w++ {
		t.Logf("window %d: free %d, pro %d", w+1, admittedIn(a, w*sec, (w+1)*sec), admittedIn(b, w*sec, (w+1)*sec))
	}
}
