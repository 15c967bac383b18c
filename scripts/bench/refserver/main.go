// Command refserver is make bench's reference for /v1/check: a straightforward
// go-redis check handler. It decodes {"org","team","user"} with encoding/json,
// coalesces concurrent checks into one pipeline of EVALSHAs of scripts/bench/ref9.lua
// (three levels x month + minute, current and previous bucket) and answers
// {"allowed":true|false}; /healthz answers like quotaplane-api's. No auth, tenancy,
// usage in the answer, metrics or durability: what any check service must at least
// do. make bench runs it under the same wrk load as quotaplane-api, in the same run,
// so the api's ratio can be read against what this machine allows.
//
// Loopback only; it exits by itself after -lifetime.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

type call struct {
	keys   []string
	weight float64
	ok     bool
	err    error
	done   chan struct{}
}

func main() {
	addr := flag.String("addr", "127.0.0.1:18190", "listen address (loopback only)")
	prefix := flag.String("prefix", "qpref", "key prefix of its counters")
	script := flag.String("script", "scripts/bench/ref9.lua", "the cascade script")
	lifetime := flag.Duration("lifetime", 10*time.Minute, "exit after this long")
	flag.Parse()
	if host, _, err := net.SplitHostPort(*addr); err != nil || !net.ParseIP(host).IsLoopback() {
		log.Fatalf("refserver: -addr %q: loopback only", *addr)
	}
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		log.Fatalf("refserver: REDIS_URL: %v", err)
	}
	rdb := redis.NewClient(opt)
	body, err := os.ReadFile(*script)
	if err != nil {
		log.Fatalf("refserver: %v", err)
	}
	ref := redis.NewScript(string(body))
	if err := ref.Load(context.Background(), rdb).Err(); err != nil {
		log.Fatalf("refserver: loading %s: %v", *script, err)
	}

	srv := &http.Server{Addr: *addr, Handler: handler(rdb, ref, *prefix), ReadHeaderTimeout: 5 * time.Second}
	time.AfterFunc(*lifetime, func() { _ = srv.Close() })
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatalf("refserver: %v", err)
	}
}

// handler serves /healthz and /v1/check; checks count under prefix.
func handler(rdb *redis.Client, ref *redis.Script, prefix string) http.Handler {
	queue := make(chan *call, 512)
	go coalesce(rdb, ref, queue)

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte("{\"status\":\"ok\"}\n"))
	})
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Org, Team, User string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		now := time.Now().UnixMilli()
		bucket := now / 60000
		cur, prev := ":w"+strconv.FormatInt(bucket, 10), ":w"+strconv.FormatInt(bucket-1, 10)
		c := &call{keys: make([]string, 0, 9), weight: 1 - float64(now%60000)/60000, done: make(chan struct{}, 1)}
		for _, id := range []string{"o", "t:" + in.Team, "u:" + in.Team + ":" + in.User} {
			k := prefix + ":{" + in.Org + "}" + id
			c.keys = append(c.keys, k+":m", k+cur, k+prev)
		}
		queue <- c
		<-c.done
		w.Header().Set("Content-Type", "application/json")
		switch {
		case c.err != nil:
			http.Error(w, c.err.Error(), http.StatusServiceUnavailable)
		case !c.ok:
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte("{\"allowed\":false}\n"))
		default:
			_, _ = w.Write([]byte("{\"allowed\":true}\n"))
		}
	})
	return mux
}

// coalesce sends whatever checks are waiting as one pipeline, then wakes their callers.
func coalesce(rdb *redis.Client, ref *redis.Script, queue chan *call) {
	ctx := context.Background()
	batch := make([]*call, 0, 128)
	cmds := make([]*redis.Cmd, 0, 128)
	for c := range queue {
		batch = append(batch[:0], c)
	fill:
		for len(batch) < cap(batch) {
			select {
			case c := <-queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		pipe := rdb.Pipeline()
		cmds = cmds[:0]
		for _, c := range batch {
			// cost 1; the previous bucket's weight; month and minute limits of org, team, user
			cmds = append(cmds, ref.EvalSha(ctx, pipe, c.keys, 1, c.weight,
				1000000000000, 1000000000000, 500000000000, 500000000000, 250000000000, 250000000000))
		}
		_, _ = pipe.Exec(ctx)
		for i, c := range batch {
			v, err := cmds[i].Int()
			c.ok, c.err = v == 1, err
			c.done <- struct{}{}
		}
	}
}
