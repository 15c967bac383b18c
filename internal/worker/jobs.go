package worker

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"math/rand/v2"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// CloseArgs is the River job that closes one org's billing period
// (billing.Closer.Close). It is unique per org and period (River UniqueOpts by args,
// in every state but cancelled and discarded), and idempotent besides: Close does
// nothing for a closed period.
type CloseArgs struct {
	Org    string `json:"org" river:"unique"`
	Period string `json:"period" river:"unique"`
}

// Kind names the job in River's tables.
func (CloseArgs) Kind() string { return "billing.close_period" }

// InsertOpts makes the job unique per org and period.
func (CloseArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 50, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// CloseScanArgs is the periodic River job that enqueues a CloseArgs job for every
// period due (billing.Closer.Due).
type CloseScanArgs struct{}

// Kind names the job in River's tables.
func (CloseScanArgs) Kind() string { return "billing.close_scan" }

// InsertOpts keeps at most one scan waiting.
func (CloseScanArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{UniqueOpts: river.UniqueOpts{ByPeriod: 30 * time.Second}}
}

// CloseScanWorker runs CloseScanArgs.
type CloseScanWorker struct {
	river.WorkerDefaults[CloseScanArgs]
	Closer *billing.Closer
}

// CloseBatch is how many periods one CloseBatchArgs job closes.
const CloseBatch = 100

// Work enqueues the periods due in batches of CloseBatch (CloseBatchArgs), unique per
// batch: two scans of the same moment insert the same batches once.
func (w *CloseScanWorker) Work(ctx context.Context, job *river.Job[CloseScanArgs]) error {
	due, err := w.Closer.Due(ctx)
	if err != nil || len(due) == 0 {
		return err
	}
	var params []river.InsertManyParams
	for b := range slices.Chunk(due, CloseBatch) {
		items := make([]CloseArgs, len(b))
		for i, a := range b {
			items[i] = CloseArgs{Org: a.Org, Period: a.Period}
		}
		params = append(params, river.InsertManyParams{Args: CloseBatchArgs{Items: items}})
	}
	client := river.ClientFromContext[pgx.Tx](ctx)
	_, err = client.InsertMany(ctx, params)
	return err
}

// CloseBatchArgs is the River job that closes several periods, sparing the queue a
// job per org. Each is closed exactly once whoever else closes it
// (billing.Closer.Close under its period lock).
type CloseBatchArgs struct {
	Items []CloseArgs `json:"items" river:"unique"`
}

// Kind names the job in River's tables.
func (CloseBatchArgs) Kind() string { return "billing.close_batch" }

// InsertOpts makes the job unique per batch, and does not retry it: what failed is
// retried as one CloseArgs job per period.
func (CloseBatchArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: 3, UniqueOpts: river.UniqueOpts{ByArgs: true}}
}

// CloseBatchWorker runs CloseBatchArgs, Parallel periods at once.
type CloseBatchWorker struct {
	river.WorkerDefaults[CloseBatchArgs]
	Closer   *billing.Closer
	Parallel int
}

// Work closes the batch; each period that failed becomes a CloseArgs job of its own,
// which River retries (or cancels, or snoozes) as CloseWorker says.
func (w *CloseBatchWorker) Work(ctx context.Context, job *river.Job[CloseBatchArgs]) error {
	items := make([]billing.OrgPeriod, len(job.Args.Items))
	for i, a := range job.Args.Items {
		items[i] = billing.OrgPeriod{Org: a.Org, Period: a.Period}
	}
	failed := w.Closer.CloseMany(ctx, items, w.Parallel)
	if len(failed) == 0 {
		return nil
	}
	var params []river.InsertManyParams
	for i := range items {
		if err, ok := failed[i]; ok && !errors.Is(err, tenants.ErrNotFound) && !errors.Is(err, billing.ErrInvalid) {
			params = append(params, river.InsertManyParams{Args: job.Args.Items[i]})
		}
	}
	if len(params) == 0 {
		return nil
	}
	_, err := river.ClientFromContext[pgx.Tx](ctx).InsertMany(ctx, params)
	return err
}

// CloseWorker runs CloseArgs.
type CloseWorker struct {
	river.WorkerDefaults[CloseArgs]
	Closer *billing.Closer
}

// Work closes the period. An unknown org cancels the job; a period not yet due (a
// clock behind the scanner's) is snoozed; other errors are retried by River.
func (w *CloseWorker) Work(ctx context.Context, job *river.Job[CloseArgs]) error {
	_, err := w.Closer.Close(ctx, job.Args.Org, job.Args.Period)
	switch {
	case errors.Is(err, tenants.ErrNotFound), errors.Is(err, billing.ErrInvalid):
		return river.JobCancel(err)
	case errors.Is(err, billing.ErrNotDue):
		return river.JobSnooze(time.Minute)
	}
	return err
}

// WebhookArgs is the River job that delivers one event to its org's webhook.
type WebhookArgs struct {
	EventID int64 `json:"event_id"`
}

// Kind names the job in River's tables.
func (WebhookArgs) Kind() string { return "billing.webhook" }

// InsertOpts gives a failing receiver 20 attempts: several hours with the default backoff.
func (WebhookArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{MaxAttempts: 20} }

// WebhookWorker runs WebhookArgs with Deliverer; every attempt is logged in
// webhook_deliveries.
type WebhookWorker struct {
	river.WorkerDefaults[WebhookArgs]
	Deliverer *webhooks.Deliverer
	// Backoff is the wait before retry attempt n (default: 2^n seconds with jitter,
	// capped at an hour).
	Backoff func(attempt int) time.Duration
}

// NextRetry applies Backoff.
func (w *WebhookWorker) NextRetry(job *river.Job[WebhookArgs]) time.Time {
	if w.Backoff != nil {
		return time.Now().Add(w.Backoff(job.Attempt))
	}
	d := time.Duration(1<<min(job.Attempt, 12)) * time.Second
	d = min(d, time.Hour)
	return time.Now().Add(d/2 + rand.N(d/2+1))
}

// Timeout bounds one attempt.
func (w *WebhookWorker) Timeout(*river.Job[WebhookArgs]) time.Duration { return time.Minute }

// Work sends the event. A delivery that cannot succeed (webhooks.ErrUndeliverable:
// an unknown event or org, a refused target) cancels the job; any other failure is
// retried with backoff.
func (w *WebhookWorker) Work(ctx context.Context, job *river.Job[WebhookArgs]) error {
	err := w.Deliverer.Deliver(ctx, job.Args.EventID, job.Attempt)
	if errors.Is(err, webhooks.ErrUndeliverable) {
		return river.JobCancel(err)
	}
	return err
}

// DeliveryQueue enqueues webhook deliveries as WebhookArgs jobs of client: the
// webhooks.Enqueuer of the flusher and the closer.
func DeliveryQueue(client *river.Client[pgx.Tx]) webhooks.Enqueuer { return deliveryQueue{client} }

type deliveryQueue struct{ c *river.Client[pgx.Tx] }

// EnqueueDelivery inserts the delivery job of eventID in tx.
func (q deliveryQueue) EnqueueDelivery(ctx context.Context, tx pgx.Tx, eventID int64) error {
	_, err := q.c.InsertTx(ctx, tx, WebhookArgs{EventID: eventID}, nil)
	return err
}

// Jobs are the River jobs of the billing and webhook domains, for NewClient to register.
type Jobs struct {
	Closer  *billing.Closer
	Webhook *WebhookWorker
	// ScanEvery is how often periods due are looked for (default 1 minute).
	ScanEvery time.Duration
	// CloseParallel is how many periods one batch job closes at once (default 4).
	CloseParallel int
}

// register adds the workers of the jobs to workers.
func (j *Jobs) register(workers *river.Workers) {
	river.AddWorker(workers, &CloseScanWorker{Closer: j.Closer})
	river.AddWorker(workers, &CloseWorker{Closer: j.Closer})
	river.AddWorker(workers, &CloseBatchWorker{Closer: j.Closer, Parallel: cmp.Or(j.CloseParallel, 4)})
	river.AddWorker(workers, j.Webhook)
}

// periodic returns the periodic jobs: the close scan, run at start and then every
// ScanEvery.
func (j *Jobs) periodic() []*river.PeriodicJob {
	every := j.ScanEvery
	if every <= 0 {
		every = time.Minute
	}
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(every),
		func() (river.JobArgs, *river.InsertOpts) { return CloseScanArgs{}, nil },
		&river.PeriodicJobOpts{RunOnStart: true})}
}
