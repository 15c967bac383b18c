// Package healthcheck is the binaries' `healthcheck` command: a GET of the process's own
// health endpoint, for container runtimes whose image has no shell or curl (the
// distroless image of docker-compose.yml's healthchecks).
package healthcheck

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Run GETs url (the args' first, else def) within 2 s and reports whether it answered
// 200; the error says what it got instead.
func Run(ctx context.Context, args []string, def string) error {
	url := def
	if len(args) > 0 {
		url = args[0]
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("healthcheck: %w", err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<16))
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("healthcheck: %s answered %s", url, res.Status)
	}
	return nil
}
