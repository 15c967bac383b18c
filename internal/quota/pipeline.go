package quota

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

// call is one check on its way through the batching loop. The loop owns it from
// the moment it is queued until it signals done.
type call struct {
	ctx  context.Context
	args []any  // evalsha, sha, numkeys, keys..., argv...
	nums []byte // the last ARGV, the packed numbers (kept for reuse)
	// wire and names hold the arguments build sends as bytes (the packed numbers, the
	// team and user fields), kept for reuse: pointers to them go into args without an
	// allocation (wireArg).
	wire   []wireArg
	names  []byte
	nowMs  int64 // the clock the check was built at
	org    string
	period vocab.Period
	req    Request // what the compact reply is decoded against
	reply  string  // "H", a replay, a decision stored for replays, or a packed decision
	err    error
	ask    string // a cluster node to send the check to with ASKING (see cluster.go)
	done   chan struct{}
	// src is the script the EVALSHA names when it is not check.lua (a reservation:
	// reserve.go), for the EVAL sent after NOSCRIPT.
	src string
	rid string // the reservation's id parsed from a reserve reply

	// A check's way to its answer (Engine.run): its attempts so far, then its answer.
	a    attempt
	res  vocab.Result
	fail error // the check's error: not decided
	held bool  // the batching loop may still hold the call: it is not recycled

	// Set by decide: the index of the call's check, and the lease path that wants to
	// observe its decision (lease.go), nil for none.
	item int
	path *leasePath

	// Set by reserve: the reservation's id and options, for building it again.
	rsvID  string
	rsvOpt ReserveOptions
}

// source is the body of the script c runs.
func (c *call) source() string {
	if c.src != "" {
		return c.src
	}
	return checkSrc
}

func (e *Engine) getCall() *call { return e.calls.Get().(*call) }

func (e *Engine) putCall(c *call) {
	clear(c.args)
	c.args, c.ctx, c.reply, c.err, c.org, c.req, c.ask, c.nowMs = c.args[:0], nil, "", nil, "", Request{}, "", 0
	c.src, c.rid = "", ""
	c.a, c.res, c.fail, c.item, c.path, c.rsvID, c.rsvOpt = attempt{}, vocab.Result{}, nil, 0, nil, "", ReserveOptions{}
	e.calls.Put(c)
}

// setReply stores cmd's reply or error in c.
func (c *call) setReply(cmd *redis.Cmd) {
	v, err := cmd.Result()
	c.reply, c.err = "", err
	if err != nil {
		return
	}
	if s, ok := v.(string); ok {
		c.reply = s
	} else {
		c.err = fmt.Errorf("%w: of type %T", ErrBadReply, v)
	}
}

// submit hands c to the batching loop and waits for its answer.
func (e *Engine) submit(ctx context.Context, c *call) error {
	c.ctx, c.err, c.reply = ctx, nil, ""
	select {
	case e.queue <- c:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.closing:
		return ErrClosed
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.stopped:
		select {
		case <-c.done:
			return nil
		default:
			return ErrClosed
		}
	}
}

// loop is the batching goroutine: it takes whatever checks are waiting, up to
// MaxBatch, sends them as one pipeline and wakes their callers. While a pipeline is
// in flight new checks queue up, so batches grow with load on their own.
func (e *Engine) loop() {
	defer close(e.stopped)
	batch := make([]*call, 0, e.cfg.MaxBatch)
	var p pipeState
	for {
		select {
		case c := <-e.queue:
			batch = append(batch[:0], c)
		fill:
			for len(batch) < e.cfg.MaxBatch {
				select {
				case c := <-e.queue:
					batch = append(batch, c)
				default:
					break fill
				}
			}
			// The pipeline does not use the callers' contexts: one caller giving up must
			// not fail the others' checks. The client's read timeout bounds it.
			e.exec(context.Background(), batch, &p)
			for _, c := range batch {
				c.done <- struct{}{}
			}
			clear(batch)
		case <-e.closing:
			for {
				select {
				case c := <-e.queue:
					c.err = ErrClosed
					c.done <- struct{}{}
				default:
					return
				}
			}
		}
	}
}

// pipeState is scratch space reused across pipelines by one goroutine.
type pipeState struct {
	cmds  []*redis.Cmd
	again []int
}

// exec runs calls as one pipeline of EVALSHAs and stores each reply or error in its
// call. Calls whose context has already ended are not sent.
//
// NOSCRIPT (after a restart, failover or SCRIPT FLUSH) means the command did not
// run, so exactly those commands are sent again, with the script's body. Nothing
// else is ever re-sent.
func (e *Engine) exec(ctx context.Context, calls []*call, p *pipeState) {
	p.cmds = p.cmds[:0]
	pipe := e.rdb.Pipeline()
	for _, c := range calls {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			p.cmds = append(p.cmds, nil)
			continue
		}
		cmd := redis.NewCmd(ctx, c.args...)
		_ = pipe.Process(ctx, cmd)
		p.cmds = append(p.cmds, cmd)
	}
	if pipe.Len() == 0 {
		return
	}
	n, t0 := pipe.Len(), time.Now() // Exec empties the pipeline
	if e.tracer != nil {
		if span := e.startPipeline(ctx, calls, n); span != nil {
			defer func() { e.endPipeline(ctx, span, calls, len(p.again)) }()
		}
	}
	_, _ = pipe.Exec(ctx) // errors are per command
	if e.cfg.OnPipeline != nil {
		e.cfg.OnPipeline(n, time.Since(t0))
	}
	p.again = p.again[:0]
	for i, cmd := range p.cmds {
		if cmd == nil {
			continue
		}
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			p.again = append(p.again, i)
			continue
		}
		calls[i].setReply(cmd)
	}
	if len(p.again) == 0 {
		return
	}
	e.lost.Add(1) // the scripts were lost: so may the reserving set have been
	// Load the script for the EVALSHAs to come (on a cluster, on every shard), and
	// re-run the refused checks with EVAL so they cannot hit NOSCRIPT again.
	loaded := map[string]bool{}
	for _, i := range p.again {
		if src := calls[i].source(); !loaded[src] {
			loaded[src] = true
			_ = e.rdb.ScriptLoad(ctx, src).Err()
		}
	}
	pipe = e.rdb.Pipeline()
	for _, i := range p.again {
		args := make([]any, len(calls[i].args))
		copy(args, calls[i].args)
		args[0], args[1] = "eval", calls[i].source()
		p.cmds[i] = redis.NewCmd(ctx, args...)
		_ = pipe.Process(ctx, p.cmds[i])
	}
	_, _ = pipe.Exec(ctx)
	for _, i := range p.again {
		calls[i].setReply(p.cmds[i])
	}
}
