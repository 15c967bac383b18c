package quota

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// On a Redis Cluster a check may be refused without being run: its slot moved
// (MOVED), is being migrated (ASK), its keys are mid-migration (TRYAGAIN), the
// cluster or the slot's primary is down (CLUSTERDOWN, MASTERDOWN), the node is a
// replica now (READONLY), it is loading (LOADING), or the connection to the slot's
// primary could not even be opened. None of these ran the script, so the engine
// sends such a check again, after refreshing the slot map, until Config.RetryBudget
// is spent. An error after the script was sent (a timeout, a reset connection) is
// never retried: the script may have run, and a second run would count the check
// twice. It fails with ErrUnavailable, so the plan's fail mode answers, and the slot
// map is refreshed for the checks that follow.

// clusterRefusal classifies err from a cluster: whether the script did not run, and
// if it was an ASK redirect, the node to ask.
type clusterRefusal struct {
	notRun bool   // the command was not run: safe to send again
	reload bool   // the slot map is stale: refresh it first
	ask    string // ASK: the node importing the slot ("host:port")
}

func classifyClusterError(err error) clusterRefusal {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		word, rest, _ := strings.Cut(msg, " ")
		switch word {
		case "MOVED":
			return clusterRefusal{notRun: true, reload: true}
		case "ASK":
			_, addr, _ := strings.Cut(rest, " ")
			return clusterRefusal{notRun: true, ask: addr}
		case "TRYAGAIN", "LOADING":
			return clusterRefusal{notRun: true}
		case "CLUSTERDOWN", "MASTERDOWN", "READONLY":
			return clusterRefusal{notRun: true, reload: true}
		}
		return clusterRefusal{}
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return clusterRefusal{notRun: true, reload: true} // nothing was written
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "EOF") ||
		strings.Contains(err.Error(), "connection reset") {
		return clusterRefusal{reload: true} // maybe run: not retried, but the node may be gone
	}
	return clusterRefusal{}
}

// retryDelay decides whether c, which failed with c.err, is sent again (see the
// comment above). It returns the pause before the next attempt; for an ASK it sets
// c.ask. tries counts c's previous re-sends; start is when the first refusal came.
func (e *Engine) retryDelay(c *call, start time.Time, tries int) (time.Duration, bool) {
	if e.cluster == nil || c.err == nil {
		return 0, false
	}
	r := classifyClusterError(c.err)
	if r.reload {
		e.cluster.ReloadState(context.Background()) // asynchronous, debounced by go-redis
	}
	if !r.notRun {
		return 0, false
	}
	pause := min(time.Duration(5<<min(tries, 5))*time.Millisecond, 100*time.Millisecond)
	if r.ask != "" {
		pause = 0
	}
	if time.Since(start)+pause > e.cfg.RetryBudget {
		return 0, false
	}
	e.metricRetry(c.err)
	c.ask = r.ask
	return pause, true
}

// sleep pauses for d unless ctx ends or the engine closes first.
func (e *Engine) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closing:
		return ErrClosed
	}
}

// sendAsking runs c on the node an ASK redirect named, preceded by ASKING, as the
// cluster protocol requires while a slot migrates. It runs on the caller's
// goroutine: redirects are rare and must not hold up the batching loop.
func (e *Engine) sendAsking(ctx context.Context, c *call) {
	addr := c.ask
	c.ask, c.err, c.reply = "", nil, ""
	var node *redis.Client
	_ = e.cluster.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
		if m.Options().Addr == addr {
			node = m
		}
		return nil
	})
	if node == nil {
		e.cluster.ReloadState(ctx)
		c.err = redis.Error(askUnknownNode{addr})
		return
	}
	pipe := node.Pipeline()
	pipe.Do(ctx, "asking")
	cmd := redis.NewCmd(ctx, c.args...)
	_ = pipe.Process(ctx, cmd)
	_, _ = pipe.Exec(ctx)
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		e.lost.Add(1)
		_ = node.ScriptLoad(ctx, c.source()).Err()
		pipe = node.Pipeline()
		pipe.Do(ctx, "asking")
		cmd = redis.NewCmd(ctx, c.args...)
		_ = pipe.Process(ctx, cmd)
		_, _ = pipe.Exec(ctx)
	}
	c.setReply(cmd)
}

// askUnknownNode is the error of an ASK to a node that is not a known primary yet;
// it reads as TRYAGAIN so the check is retried once the slot map is fresh.
type askUnknownNode struct{ addr string }

func (a askUnknownNode) Error() string { return "TRYAGAIN ASK to unknown node " + a.addr }
func (askUnknownNode) RedisError()     {}

// metricRetry reports a re-sent check to Config.OnResend.
func (e *Engine) metricRetry(err error) {
	if e.cfg.OnResend == nil {
		return
	}
	reason := "dial"
	var rerr redis.Error
	if errors.As(err, &rerr) {
		reason, _, _ = strings.Cut(rerr.Error(), " ")
	}
	e.cfg.OnResend(reason)
}
