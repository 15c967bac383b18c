package quota

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/vocab"
)

//go:embed scripts/adjust.lua
var adjustSrc string

var adjustScript = redis.NewScript(adjustSrc)

// redirtyScript marks month counters changed again: KEYS[1] the dirty set, ARGV[1] its
// expiry (unix s), then the fields. '|' as in check.lua.
var redirtyScript = redis.NewScript(`if redis.call('SADD', KEYS[1], '|', unpack(ARGV, 2)) > #ARGV - 1 then
  redis.call('EXPIREAT', KEYS[1], ARGV[1]) end
redis.call('SADD', KEYS[2], string.match(KEYS[1], ':{([^}]*)}|'))
return 0`)

// Adjusted is what AdjustCounter did to one month counter: its committed units (the
// counter less the units held by open reservations) before and after, in Period, at
// At (the engine's clock, read after the change).
type Adjusted struct {
	Period vocab.Period
	Before int64
	After  int64
	At     time.Time
}

// AdjustCounter corrects one month counter of org in the current period (anchorDay
// as Request.AnchorDay): with set, its committed units become n; without, n is added
// to them (n may be negative). The result stays within 0..MaxCounter less the held
// units. The counter is marked for the next drain; hydrating first if Redis lost the
// period. It changes Redis only: the caller (billing) writes the ledger and the audit
// log, and must keep a drain taken before At from raising the ledger back.
//
// Errors: ErrInvalid for a bad org, counter or amount; ErrNotHydrated and
// ErrUnavailable as Check.
func (e *Engine) AdjustCounter(ctx context.Context, org string, anchorDay int, c Counter, set bool, n int64) (Adjusted, error) {
	switch {
	case !vocab.ValidID(org):
		return Adjusted{}, fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	case !vocab.ValidID(c.Metric) || levelLetter(c.Level) == "" ||
		c.Level != vocab.LevelOrg && !vocab.ValidID(c.Team) || c.Level == vocab.LevelUser && !vocab.ValidID(c.User):
		return Adjusted{}, fmt.Errorf("%w: counter %+v is not valid", ErrInvalid, c)
	case set && (n < 0 || n > vocab.MaxUnits), !set && (n < -vocab.MaxUnits || n > vocab.MaxUnits):
		return Adjusted{}, fmt.Errorf("%w: amount %d is outside the bound %d", ErrInvalid, n, vocab.MaxUnits)
	}
	op := "add"
	if set {
		op = "set"
	}
	tag := orgTag(e.cfg.KeyPrefix, org)
	for hydrated := false; ; hydrated = true {
		per := vocab.PeriodAt(e.Now(), anchorDay)
		keys := []string{tag + "m|" + per.ID, tag + "d|" + per.ID, tag + "h|" + per.ID, e.indexKey(org)}
		s, err := adjustScript.Run(ctx, e.rdb, keys, c.field(), op, n, per.End.Add(e.cfg.MonthRetention).Unix()).Text()
		if err != nil {
			return Adjusted{}, fmt.Errorf("adjust %s: %w: %w", org, ErrUnavailable, err)
		}
		if s == "H" {
			if hydrated {
				return Adjusted{}, fmt.Errorf("adjust %s: %w: marker still missing after hydration", org, ErrNotHydrated)
			}
			if err := e.hydrate(ctx, org, per); err != nil {
				return Adjusted{}, err
			}
			continue
		}
		b, a, ok := strings.Cut(s, ";")
		before, err1 := strconv.ParseInt(b, 10, 64)
		after, err2 := strconv.ParseInt(a, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return Adjusted{}, fmt.Errorf("adjust %s: %w %q", org, ErrBadReply, s)
		}
		return Adjusted{Period: per, Before: before, After: after, At: e.Now()}, nil
	}
}

// MarkDirty marks c of org in per changed, for the next drain: after an adjustment
// is in the ledger, so that a drain that took the counter meanwhile (and whose value
// the ledger kept out, or took before the ledger's row was written) is followed by
// one that persists it.
//
// Errors: ErrInvalid for a bad org; ErrUnavailable when Redis fails.
func (e *Engine) MarkDirty(ctx context.Context, org string, per vocab.Period, c Counter) error {
	if !vocab.ValidID(org) {
		return fmt.Errorf("%w: org %q is not a valid id", ErrInvalid, org)
	}
	key := orgTag(e.cfg.KeyPrefix, org) + "d|" + per.ID
	if err := redirtyScript.Run(ctx, e.rdb, []string{key, e.indexKey(org)}, per.End.Add(e.cfg.MonthRetention).Unix(), c.field()).Err(); err != nil {
		return fmt.Errorf("mark dirty %s: %w: %w", org, ErrUnavailable, err)
	}
	return nil
}
