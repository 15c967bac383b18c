package worker

import (
	"context"
	"log/slog"
	"strings"
)

// routine are the suffixes of River's info messages that repeat while all is well:
// a producer's job counts whenever they change, and each maintenance service's
// "ran successfully". They go to debug; everything else River says keeps its level.
var routine = []string{": Producer job counts", ": Ran successfully"}

// quietRoutine wraps River's log handler so its routine chatter is logged at debug.
type quietRoutine struct{ slog.Handler }

func (h quietRoutine) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo && isRoutine(r.Message) {
		if !h.Handler.Enabled(ctx, slog.LevelDebug) {
			return nil
		}
		r = r.Clone()
		r.Level = slog.LevelDebug
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietRoutine) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietRoutine{h.Handler.WithAttrs(attrs)}
}

func (h quietRoutine) WithGroup(name string) slog.Handler {
	return quietRoutine{h.Handler.WithGroup(name)}
}

func isRoutine(msg string) bool {
	for _, s := range routine {
		if strings.HasSuffix(msg, s) {
			return true
		}
	}
	return false
}
