package webhooks_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/ledger"
	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
	"github.com/quotaplane/quotaplane/internal/worker"
)

// Money: a spend budget raises threshold events as any month limit does. The spend
// counter is the one priced checks write (checks.price adds spend to the decision as
// one more metric), so a budget's 80 % reaches the org's webhook.
func TestWebhookSpendBudgetThreshold(t *testing.T) {
	e := newEnv(t)
	e.migrateRiver()
	ctx := context.Background()
	org := testenv.ID(t, "money")
	rcv := newReceiver(t, org, 0)
	e.Seed(org, []vocab.Limit{monthLimit("requests", 1000)}, nil)
	usd, rates := "USD", []tenants.Rate{{Metric: "tokens", Price: "2.50", Per: 1_000_000}}
	if _, err := e.Svc.UpdatePlan(ctx, operator, "plan-"+org, tenants.PlanPatch{Currency: &usd, Rates: &rates}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Svc.CreateTeam(ctx, operator, org, tenants.TeamInput{ID: "eng", Name: "Eng",
		UserLimits: []vocab.Limit{monthLimit("spend", 10_000_000)}}); err != nil { // 10.00 USD a user
		t.Fatal(err)
	}
	url := rcv.srv.URL + "/hook"
	if _, err := e.Svc.UpdateOrg(ctx, operator, org, tenants.OrgPatch{WebhookURL: &url}); err != nil {
		t.Fatal(err)
	}
	hook := &worker.WebhookWorker{Deliverer: &webhooks.Deliverer{Store: e.hooks, Tenants: e.Svc, Secret: master,
		Client: webhooks.NewClient(5*time.Second, true)}, Backoff: func(int) time.Duration { return 100 * time.Millisecond }}
	client, _ := e.startWorker("worker-money", nil, hook)
	f := ledger.NewFlusher(ledger.FlusherConfig{Store: e.Ledger, Tenants: e.Svc, Counters: oneEngine(e.Engine),
		Queue: func() webhooks.Enqueuer { return worker.DeliveryQueue(client) }, Logger: quietLog()})
	if _, err := e.Check(e.Engine, org, "eng", "alice", "spend", 8_000_000); err != nil { // 8.00 USD: 80 %
		t.Fatal(err)
	}
	if _, err := f.FlushOnce(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the spend threshold event delivered", func() bool { return len(rcv.received()) > 0 })
	if got := thresholdKeys(t, rcv.received()); strings.Join(got, " ") != "user:eng/alice:spend:80" {
		t.Errorf("received %v, want alice's spend at 80 %% once", got)
	}
}
