package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The api starts on an empty database, serves, and stops cleanly when its context
// ends (what SIGTERM does through signal.NotifyContext).
func TestRunServesAndShutsDownGracefully(t *testing.T) {
	addr := freeAddr(t)
	env := map[string]string{"DATABASE_URL": testenv.PostgresURL(t), "REDIS_URL": testenv.RedisURL(t),
		"QUOTA_HTTP_ADDR": addr, "QUOTA_ADMIN_TOKEN": "a-test-operator-token", "QUOTA_LOG_LEVEL": "error"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, nil, func(k string) string { return env[k] }, &bytes.Buffer{}) }()

	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("api not ready: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v after shutdown", err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("api did not stop")
	}
}

func TestRunRejectsBadConfigListingEveryProblem(t *testing.T) {
	env := map[string]string{"QUOTA_HTTP_ADDR": "8080", "QUOTA_ADMIN_TOKEN": "short"}
	err := run(context.Background(), nil, func(k string) string { return env[k] }, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "QUOTA_HTTP_ADDR") || !strings.Contains(err.Error(), "QUOTA_ADMIN_TOKEN") {
		t.Fatalf("err = %v", err)
	}
}
