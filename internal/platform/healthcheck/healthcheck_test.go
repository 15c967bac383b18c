package healthcheck_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/healthcheck"
)

func TestRun(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	ctx := context.Background()
	if err := healthcheck.Run(ctx, nil, srv.URL+"/healthz"); err != nil {
		t.Errorf("healthy: %v", err)
	}
	if err := healthcheck.Run(ctx, []string{srv.URL + "/nope"}, srv.URL+"/healthz"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("the argument's url: %v, want its 404", err)
	}
	status = http.StatusServiceUnavailable
	if err := healthcheck.Run(ctx, nil, srv.URL+"/healthz"); err == nil {
		t.Error("a 503 passed")
	}
	srv.Close()
	if err := healthcheck.Run(ctx, nil, srv.URL+"/healthz"); err == nil {
		t.Error("a closed port passed")
	}
}
