package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// The reference counts like ref9.lua: each check adds its cost to the month key of
// org, team and user, and the answer says it was allowed.
func TestReferenceChecksCount(t *testing.T) {
	rdb := testenv.Redis(t)
	body, err := os.ReadFile("../ref9.lua")
	if err != nil {
		t.Fatal(err)
	}
	ref := redis.NewScript(string(body))
	if err := ref.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	prefix := testenv.ID(t, "ref")
	t.Cleanup(func() {
		keys, _ := rdb.Keys(context.Background(), prefix+":*").Result()
		if len(keys) > 0 {
			rdb.Del(context.Background(), keys...)
		}
	})
	srv := httptest.NewServer(handler(rdb, ref, prefix))
	defer srv.Close()
	for i := 0; i < 3; i++ {
		res, err := http.Post(srv.URL+"/v1/check", "application/json", strings.NewReader(`{"org":"o1","team":"eng","user":"u1"}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || string(b) != "{\"allowed\":true}\n" {
			t.Fatalf("check %d: %d %q", i, res.StatusCode, b)
		}
	}
	for _, k := range []string{"o", "t:eng", "u:eng:u1"} {
		if n, err := rdb.Get(context.Background(), prefix+":{o1}"+k+":m").Int(); err != nil || n != 3 {
			t.Errorf("month counter of %s: %d, %v; want 3", k, n, err)
		}
	}
	res, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %d", res.StatusCode)
	}
}
