package faulttest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// buildBinaries builds quotaplane-api and quotaplane-worker from the checkout at root
// into dir, with -race when race is set.
func buildBinaries(ctx context.Context, root, dir string, race bool) (api, worker string, err error) {
	for _, b := range []struct{ name, pkg string }{{"quotaplane-api", "./cmd/api"}, {"quotaplane-worker", "./cmd/worker"}} {
		args := []string{"build"}
		if race {
			args = append(args, "-race")
		}
		args = append(args, "-o", filepath.Join(dir, b.name), b.pkg)
		build := exec.CommandContext(ctx, "go", args...)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return filepath.Join(dir, "quotaplane-api"), filepath.Join(dir, "quotaplane-worker"), nil
}

// waitHTTP polls url until it answers 200 or within passes.
func waitHTTP(url string, within time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for {
		res, err := client.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("answered %d", res.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w", url, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redisServer is a private redis-server without persistence on a port of its own:
// killed -9 and started again it comes back empty on the same port.
type redisServer struct {
	*testenv.Proc
	port int
}

func newRedisServer(port int) *redisServer {
	return &redisServer{port: port, Proc: &testenv.Proc{Name: "redis-server", Path: "redis-server",
		Args: []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--protected-mode", "no"}, Env: os.Environ()}}
}

func (r *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

// startAndWait starts the server and waits until it answers PING.
func (r *redisServer) startAndWait() error {
	if err := r.Start(); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: r.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s does not answer: %w", r.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
