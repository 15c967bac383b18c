package faulttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// faultKind names a fault.
type faultKind string

// The faults.
const (
	killAPI      faultKind = "kill-api"      // kill -9 of a replica, started again after down
	killWorker   faultKind = "kill-worker"   // kill -9 of the worker, started again after down
	restartRedis faultKind = "restart-redis" // kill -9 of redis-server, started again empty after down
	cutRedis     faultKind = "cut"           // the proxy closes every api-Redis connection and refuses new ones for down
	dropReplies  faultKind = "drop"          // the proxy swallows Redis's replies on open connections for down
	clockStep    faultKind = "clock"         // a replica's (or the worker's) engine clock steps +-2 s
)

// fault is one planned fault: its kind, target, and how long the target stays down.
type fault struct {
	kind    faultKind
	gap     time.Duration // quiet time before it, after the previous fault healed
	target  int           // replica (kill-api, clock; -1 for the worker's clock)
	down    time.Duration
	forward bool // clock: +2 s, else -2 s
}

func (f fault) String() string {
	switch f.kind {
	case killAPI:
		return fmt.Sprintf("%s api-%d down %v", f.kind, f.target, f.down)
	case clockStep:
		who, step := fmt.Sprintf("api-%d", f.target), "-2s"
		if f.target < 0 {
			who = "worker"
		}
		if f.forward {
			step = "+2s"
		}
		return fmt.Sprintf("%s %s %s", f.kind, who, step)
	}
	return fmt.Sprintf("%s down %v", f.kind, f.down)
}

// injected is a fault as it happened.
type injected struct {
	fault
	at, healed time.Time
	err        error
	// loss (restart-redis) is per counter field the units Redis held when it died
	// (held ones included) less those the ledger held (its counters and the units of
	// the reservations it persisted held): what the restart lost; gain is the opposite
	// (a settlement since the last flush undone: the reservation is held again).
	loss, gain map[string]int64
	// lastFlush (restart-redis) is when the worker's last complete flush before the
	// kill started: usage admitted since may be lost.
	lastFlush time.Time
	killedAt  time.Time // restart-redis: when kill -9 returned
}

// planFaults draws a schedule from seed: with each set, every kind `each` times in a
// random order (the fixed short schedule); else kinds at random until about duration
// of faults and gaps is planned.
func planFaults(seed uint64, kinds []faultKind, each int, duration time.Duration, replicas int) []fault {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	draw := func(k faultKind) fault {
		f := fault{kind: k, gap: time.Duration(700+r.IntN(1300)) * time.Millisecond}
		switch k {
		case killAPI:
			f.target, f.down = r.IntN(replicas), time.Duration(200+r.IntN(1500))*time.Millisecond
		case killWorker:
			f.down = time.Duration(200+r.IntN(2000)) * time.Millisecond
		case restartRedis:
			f.down = time.Duration(100+r.IntN(900)) * time.Millisecond
		case cutRedis:
			f.down = time.Duration(300+r.IntN(1700)) * time.Millisecond
		case dropReplies:
			f.down = time.Duration(300+r.IntN(1200)) * time.Millisecond
		case clockStep:
			// A replica's clock, or (in a random schedule, one time in replicas+1) the
			// worker's: the fixed schedule steps replicas, whose clocks decide.
			f.target, f.forward = r.IntN(replicas), r.IntN(2) == 0
			if each == 0 {
				f.target = r.IntN(replicas+1) - 1
			}
		}
		return f
	}
	var out []fault
	if each > 0 {
		var ks []faultKind
		for _, k := range kinds {
			for range each {
				ks = append(ks, k)
			}
		}
		r.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
		for _, k := range ks {
			out = append(out, draw(k))
		}
		return out
	}
	var planned time.Duration
	for planned < duration {
		f := draw(kinds[r.IntN(len(kinds))])
		planned += f.gap + f.down + time.Second // a restart takes about a second
		out = append(out, f)
	}
	return out
}

// inject runs the schedule on c until it is done or until ctx ends (no fault is
// started later than last), healing each fault before the next: faults never overlap,
// so each is told apart in the oracle's figures.
func inject(ctx context.Context, c *cluster, plan []fault, start, last time.Time, logf func(string, ...any)) []injected {
	var done []injected
	for i, f := range plan {
		select {
		case <-ctx.Done():
			return done
		case <-time.After(f.gap):
		}
		if time.Now().After(last) {
			logf("faults: %d of %d planned faults injected; the rest would end too close to the end of the load", i, len(plan))
			return done
		}
		in := injected{fault: f, at: time.Now()}
		logf("fault %2d at %6.2fs (%s): %s", i+1, in.at.Sub(start).Seconds(), in.at.UTC().Format("15:04:05.000"), f)
		switch f.kind {
		case killAPI:
			c.apis[f.target].Kill9()
			time.Sleep(f.down)
			in.err = c.restartAPI(f.target)
		case killWorker:
			c.worker.Kill9()
			time.Sleep(f.down)
			in.err = c.restartWorker()
		case restartRedis:
			var before, after map[string]int64
			in.lastFlush = c.lastFlush(ctx)
			before, in.err = c.killRedis(ctx)
			in.killedAt = time.Now()
			time.Sleep(f.down)
			if in.err == nil {
				after, in.err = c.ledger(ctx)
			}
			if err := c.restartRedis(); in.err == nil {
				in.err = err
			}
			in.loss, in.gain = map[string]int64{}, map[string]int64{}
			var lost, gained int64
			if before == nil { // not hydrated: nothing to lose
				after = nil
			}
			var undirty []string // lost by counters no drain would have taken
			for k := range mergeKeys(before, after) {
				d := before[k] - after[k]
				switch {
				case d > 0:
					in.loss[k] = d
					if !c.dirtyAtKill[k] {
						undirty = append(undirty, fmt.Sprintf("%s %d", fieldName(k), d))
					}
				case d < 0:
					in.gain[k] = -d
				}
				if strings.Count(k, "|") == 1 { // org level
					lost, gained = lost+max(d, 0), gained+max(-d, 0)
				}
			}
			age := "none yet"
			if !in.lastFlush.IsZero() {
				age = in.at.Sub(in.lastFlush).Round(time.Millisecond).String() + " before"
			}
			if before == nil && in.err == nil {
				logf("fault %2d: Redis had not been hydrated since its last restart: nothing to lose", i+1)
			} else {
				logf("fault %2d: Redis held %d units more than the ledger (lost with it), %d fewer; the last complete flush started %s",
					i+1, lost, gained, age)
			}
			if len(undirty) > 0 {
				// A drain took them and its write never came (a worker killed mid-flush):
				// however recent the last flush, it did not persist them.
				slices.Sort(undirty)
				logf("fault %2d: lost by counters not in the dirty set (drained; their write not yet, or never, made): %s", i+1, strings.Join(undirty, ", "))
			}
		case cutRedis:
			c.proxy.cut()
			time.Sleep(f.down)
			c.proxy.heal()
		case dropReplies:
			c.proxy.drop()
			time.Sleep(f.down)
			c.proxy.heal()
		case clockStep:
			if f.target < 0 {
				in.err = c.stepWorkerClock(f.forward)
			} else {
				in.err = c.stepClock(f.target, f.forward)
			}
		}
		in.healed = time.Now()
		if in.err != nil {
			logf("fault %2d: %v", i+1, in.err)
		} else if f.kind != clockStep {
			logf("fault %2d healed at %6.2fs", i+1, in.healed.Sub(start).Seconds())
		}
		done = append(done, in)
	}
	return done
}

func mergeKeys(a, b map[string]int64) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}
