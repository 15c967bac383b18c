package ledger

import (
	"context"
	"time"

	"github.com/quotaplane/quotaplane/internal/quota"
)

// QueueThresholdCheck queues a threshold check as a tick's write does.
func (f *Flusher) QueueThresholdCheck(org, period string, end time.Time, counters map[quota.Counter]int64) {
	f.after.check(org, period, end, counters)
}

// RunAfterWork runs the after-work with a minute to go, and returns what is left.
func (f *Flusher) RunAfterWork(ctx context.Context) int {
	return f.runAfter(ctx, time.Now().Add(time.Minute), f.cfg.Clock())
}
