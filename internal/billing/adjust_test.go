package billing_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/billing"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// An adjustment made while checks count and the worker flushes without pause: once
// the load stops and one more flush runs, the ledger holds exactly the live committed
// value (the adjusted figure plus what was counted after it), never the wrong figure
// from before the adjustment, whichever drain raced it. Run under -race. Before the
// adjusted_at rule a drain taken before the adjustment could raise the row back.
func TestAdjustmentRacingDrainsAndChecks(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.Seed("acme", []vocab.Limit{monthLimit("tokens", 1_000_000)}, nil, tenants.TeamInput{ID: "eng"})
	svc := &billing.Service{Store: e.store, Tenants: e.Svc, Counters: oneEngine(e.Engine), Logger: quietLog()}
	org := quota.Counter{Metric: "tokens", Level: vocab.LevelOrg}
	per := vocab.PeriodAt(time.Now(), 0)

	for round := range 5 {
		// A wrong figure, drained into the ledger.
		wrong := int64(900_000 + round)
		if _, err := svc.AdjustUsage(ctx, operator, "acme", billing.AdjustInput{Metric: "tokens", Set: &wrong, Reason: "setup"}); err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var checked atomic.Int64
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if res, err := e.Check(e.Engine, "acme", "eng", "", "tokens", 1); err == nil && res.Allowed {
					checked.Add(1)
				}
			}
		})
		wg.Go(func() {
			f := e.Flusher(time.Hour)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.FlushOnce(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
		time.Sleep(30 * time.Millisecond)
		right := int64(10)
		adj, err := svc.AdjustUsage(ctx, operator, "acme", billing.AdjustInput{Metric: "tokens", Set: &right, Reason: "ticket 22"})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
		close(stop)
		wg.Wait()
		if _, err := e.Flusher(time.Hour).FlushOnce(ctx); err != nil {
			t.Fatal(err)
		}
		live, err := e.Engine.MonthUsage(ctx, "acme", per.ID)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := e.store.Ledger().Usage(ctx, "acme", per.ID)
		if err != nil {
			t.Fatal(err)
		}
		if stored[org] != live[org] || live[org] >= wrong || live[org] < adj.After {
			t.Fatalf("round %d: ledger %d, live %d after setting %d (wrong %d, %d checks)", round, stored[org], live[org],
				adj.After, wrong, checked.Load())
		}
	}
}

// A reason with the NUL character is refused before anything moves: the live counter
// used to move first, then the audit row failed in Postgres, and the caller got a 503
// that invited a retry, so an "add" applied once per attempt, unaudited.
func TestAdjustmentWithANULReasonMovesNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.Seed("acme", []vocab.Limit{monthLimit("tokens", 1_000_000)}, nil, tenants.TeamInput{ID: "eng"})
	svc := &billing.Service{Store: e.store, Tenants: e.Svc, Counters: oneEngine(e.Engine), Logger: quietLog()}
	per := vocab.PeriodAt(time.Now(), 0)
	if res, err := e.Check(e.Engine, "acme", "eng", "", "tokens", 9); err != nil || !res.Allowed {
		t.Fatalf("check: %+v %v", res, err)
	}
	four := int64(4)
	_, err := svc.AdjustUsage(ctx, operator, "acme", billing.AdjustInput{Metric: "tokens", Add: &four, Reason: "x\x00"})
	var ve *tenants.ValidationError
	if !errors.As(err, &ve) || len(ve.Fields) != 1 || ve.Fields[0].Field != "reason" {
		t.Fatalf("err = %v, want a validation error naming reason", err)
	}
	live, err := e.Engine.MonthUsage(ctx, "acme", per.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := live[quota.Counter{Metric: "tokens", Level: vocab.LevelOrg}]; got != 9 {
		t.Errorf("the org's counter is %d after a refused adjustment, want 9", got)
	}
}
