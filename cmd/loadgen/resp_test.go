package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/quota"
)

// loadgen -resp writes commands Redis runs as the engine's checks: sent raw over a
// socket (as redis-cli --pipe sends them), each is decided and counted. The stream
// loads the script itself, with the very sha its EVALSHAs name: make bench failed with
// NOSCRIPT on a Redis that had never run the engine, because it loaded the body
// through "$(cat check.lua)", which drops the last newline.
func TestWriteRESPCommandsAreChecks(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	org := testenv.ID(t, "resp")
	t.Cleanup(func() {
		keys, _ := rdb.Keys(ctx, "q:{"+org+"}*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	})
	args, err := quota.CheckCommand("q", quota.Request{Org: org, Metric: "requests"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	month := args[3].(string)
	rdb.HSet(ctx, month, "|p", 1) // the period marker: the org is hydrated

	const n = 2500 // users u0..u999: u0..u499 checked three times, the rest twice
	var out bytes.Buffer
	if err := writeRESP(&out, n, org); err != nil {
		t.Fatal(err)
	}
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", opt.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	if opt.DB != 0 {
		conn.Write([]byte("*2\r\n$6\r\nSELECT\r\n$" + strconv.Itoa(len(strconv.Itoa(opt.DB))) + "\r\n" + strconv.Itoa(opt.DB) + "\r\n"))
	}
	go conn.Write(out.Bytes())
	rd := bufio.NewReader(conn)
	if opt.DB != 0 {
		if line, _ := rd.ReadString('\n'); !strings.HasPrefix(line, "+OK") {
			t.Fatalf("SELECT: %q", line)
		}
	}
	line, err := rd.ReadString('\n') // SCRIPT LOAD's reply: $40, the sha
	if err != nil || line != "$40\r\n" {
		t.Fatalf("first reply %q (%v), want the sha SCRIPT LOAD answers", line, err)
	}
	sha, _ := rd.ReadString('\n')
	if want := args[1].(string); strings.TrimSpace(sha) != want {
		t.Fatalf("the stream loads a script of sha %q; its EVALSHAs name %q", strings.TrimSpace(sha), want)
	}
	for i := range n {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		size, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
		if !strings.HasPrefix(line, "$") || err != nil {
			t.Fatalf("reply %d: %q, want a packed decision", i, line)
		}
		b := make([]byte, size+2)
		if _, err := io.ReadFull(rd, b); err != nil {
			t.Fatal(err)
		}
		if size != 8*9 || b[0] != 0 { // status, retry, blocked, 6 rows; status 1.0 starts with a zero byte
			t.Fatalf("reply %d: %d bytes %q, want a packed decision of 6 rows", i, size, b)
		}
	}
	got, err := rdb.HMGet(ctx, month, "requests|o", "requests|t|eng", "requests|u|eng|u0", "requests|u|eng|u999").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := []any{"2500", "2500", "3", "2"}; !equalAny(got, want) {
		t.Errorf("month counters %v, want %v", got, want)
	}
}

func equalAny(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
