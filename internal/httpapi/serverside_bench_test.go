package httpapi_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"github.com/quotaplane/quotaplane/internal/quota"
)

// The server side of a check alone: the api's handler (middleware, the check route, the
// check service, the engine and its pipeline to Redis) called directly, with no client
// and no net/http connection, so allocs/op is the api's own per check. What net/http's
// server allocates per request around the handler (the request, its header map, the
// response) is not in it; it is the same for every route.

// sinkWriter is a ResponseWriter that keeps nothing but the status and the length.
type sinkWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *sinkWriter) Header() http.Header { return w.h }
func (w *sinkWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}
func (w *sinkWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = 200
	}
	w.n += len(p)
	return len(p), nil
}

// body is a request body read again on every iteration.
type body struct{ bytes.Reader }

func (*body) Close() error { return nil }

// serve calls h with b.N requests from about 50 goroutines, as drive's 50 connections,
// each goroutine reusing its request, body and writer, so that the allocations
// counted are the handler's only.
func serve(b *testing.B, h http.Handler, method, path, key string, bodies [][]byte, want int) {
	b.Helper()
	b.SetParallelism(max(1, 50/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	var next int64
	b.RunParallel(func(pb *testing.PB) {
		rd := &body{}
		req := httptest.NewRequest(method, path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		w := &sinkWriter{h: http.Header{}}
		i := int(next) // a different start per goroutine is not needed: bodies repeat
		for pb.Next() {
			i++
			p := bodies[i%len(bodies)]
			rd.Reset(p)
			req.Body, req.ContentLength = rd, int64(len(p))
			clear(w.h)
			w.status, w.n = 0, 0
			h.ServeHTTP(w, req)
			if w.status != want {
				b.Errorf("status %d, want %d", w.status, want)
				return
			}
		}
	})
}

func userBodies(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = fmt.Appendf(nil, `{"org":"acme","team":"eng","user":"u%d"}`, i)
	}
	return out
}

// BenchmarkServerHealthz is the handler's floor: /healthz through the same middleware.
func BenchmarkServerHealthz(b *testing.B) {
	h, key := benchHandler(b, nil, quota.LeaseConfig{})
	serve(b, h, "GET", "/healthz", key, [][]byte{nil}, 200)
}

// BenchmarkServerCheck: the spread path, one check of 1,000 users a request, a Redis
// round trip each (allocs/op: the api's per check).
func BenchmarkServerCheck(b *testing.B) {
	h, key := benchHandler(b, nil, quota.LeaseConfig{})
	serve(b, h, "POST", "/v1/check", key, userBodies(1000), 200)
}

// BenchmarkServerCheckHot: one user, leases on: answered in process.
func BenchmarkServerCheckHot(b *testing.B) {
	h, key := benchHandler(b, nil, quota.LeaseConfig{Enabled: true})
	serve(b, h, "POST", "/v1/check", key, [][]byte{[]byte(`{"org":"acme","team":"eng","user":"hot"}`)}, 200)
}

// BenchmarkServerCheckBatch: 100 checks a request (allocs/op: per request of 100).
func BenchmarkServerCheckBatch(b *testing.B) {
	h, key := benchHandler(b, nil, quota.LeaseConfig{})
	var buf bytes.Buffer
	buf.WriteString(`{"checks":[`)
	for u := range 100 {
		if u > 0 {
			buf.WriteByte(',')
		}
		fmt.Fprintf(&buf, `{"org":"acme","team":"eng","user":"u%d"}`, u)
	}
	buf.WriteString(`]}`)
	serve(b, h, "POST", "/v1/check/batch", key, [][]byte{buf.Bytes()}, 200)
}
