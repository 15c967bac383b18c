package billing

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/quotaplane/quotaplane/internal/tenants"
)

// CloseArgs is the River job that closes one org's billing period. It is unique per
// org and period (River UniqueOpts by args, in every state but cancelled and
// discarded), and idempotent besides: Close does nothing for a closed period.
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
// period due (Closer.Due).
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
	Closer *Closer
}

// Work enqueues the periods due; jobs already there are skipped as duplicates.
func (w *CloseScanWorker) Work(ctx context.Context, job *river.Job[CloseScanArgs]) error {
	due, err := w.Closer.Due(ctx)
	if err != nil || len(due) == 0 {
		return err
	}
	params := make([]river.InsertManyParams, len(due))
	for i, a := range due {
		params[i] = river.InsertManyParams{Args: a}
	}
	client := river.ClientFromContext[pgx.Tx](ctx)
	_, err = client.InsertMany(ctx, params)
	return err
}

// CloseWorker runs CloseArgs.
type CloseWorker struct {
	river.WorkerDefaults[CloseArgs]
	Closer *Closer
}

// Work closes the period. An unknown org cancels the job; a period not yet due (a
// clock behind the scanner's) is snoozed; other errors are retried by River.
func (w *CloseWorker) Work(ctx context.Context, job *river.Job[CloseArgs]) error {
	_, err := w.Closer.Close(ctx, job.Args.Org, job.Args.Period)
	switch {
	case errors.Is(err, tenants.ErrNotFound), errors.Is(err, ErrInvalid):
		return river.JobCancel(err)
	case errors.Is(err, ErrNotDue):
		return river.JobSnooze(time.Minute)
	}
	return err
}

// Jobs are the River jobs of the billing domain, for the worker to register.
type Jobs struct {
	Closer  *Closer
	Webhook *WebhookWorker
	// ScanEvery is how often periods due are looked for (default 1 minute).
	ScanEvery time.Duration
}

// Register adds the billing workers to workers.
func (j *Jobs) Register(workers *river.Workers) {
	river.AddWorker(workers, &CloseScanWorker{Closer: j.Closer})
	river.AddWorker(workers, &CloseWorker{Closer: j.Closer})
	river.AddWorker(workers, j.Webhook)
}

// Periodic returns the periodic jobs: the close scan, run at start and then every
// ScanEvery.
func (j *Jobs) Periodic() []*river.PeriodicJob {
	every := j.ScanEvery
	if every <= 0 {
		every = time.Minute
	}
	return []*river.PeriodicJob{river.NewPeriodicJob(river.PeriodicInterval(every),
		func() (river.JobArgs, *river.InsertOpts) { return CloseScanArgs{}, nil },
		&river.PeriodicJobOpts{RunOnStart: true})}
}
