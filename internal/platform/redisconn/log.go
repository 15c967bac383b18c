package redisconn

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// LogTo sends go-redis's own messages (a pool that cannot dial, a pub/sub that
// reconnects) to log as JSON at warn, instead of go-redis's plain lines on stderr.
// go-redis has one logger per process, so the last call wins.
func LogTo(log *slog.Logger) {
	redis.SetLogger(slogAdapter{log: log.With("component", "go-redis")})
}

type slogAdapter struct{ log *slog.Logger }

// Printf is go-redis's logging interface; its messages carry no level, and all of
// them report something going wrong with a connection.
func (a slogAdapter) Printf(ctx context.Context, format string, v ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	a.log.WarnContext(ctx, strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "))
}
