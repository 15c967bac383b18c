package quotaplanetest_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/middleware"
	"github.com/quotaplane/quotaplane/client/quotaplanetest"
)

// newService is a user's service, as it would be wired in production: a /complete
// endpoint under the reserve middleware that reports the tokens it used. The test
// below runs it without a Quotaplane.
func newService(qp middleware.Quota) http.Handler {
	mux := http.NewServeMux()
	reserve := middleware.Reserve(qp, func(r *http.Request) (client.ReserveRequest, error) {
		return client.ReserveRequest{Org: "demo", Team: "eng", User: r.Header.Get("X-User"), Metric: "tokens", Amount: 2000}, nil
	})
	mux.Handle("POST /complete", reserve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens := int64(len(r.Header.Get("X-Prompt")) * 3) // the "model"
		middleware.ReportUsage(r.Context(), tokens)
		_ = json.NewEncoder(w).Encode(map[string]int64{"tokens": tokens})
	})))
	return mux
}

// A user's handler tested without an api: with Noop it runs as in production; with
// the fake server, a scripted denial answers 429 and the handler never runs, and an
// allowed call's reservation is committed with what the handler reported.
func TestAUsersHandlerWithoutAnAPI(t *testing.T) {
	post := func(h http.Handler, user string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/complete", nil)
		req.Header.Set("X-User", user)
		req.Header.Set("X-Prompt", "write a haiku")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := post(newService(quotaplanetest.Noop{}), "alice"); rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"tokens":39}` {
		t.Errorf("with Noop: %d %s", rec.Code, rec.Body)
	}

	qp := quotaplanetest.NewServer()
	defer qp.Close()
	qp.Decide(func(c quotaplanetest.Call) quotaplanetest.Verdict {
		return quotaplanetest.Verdict{Deny: c.User == "bob"}
	})
	svc := newService(qp.Client())
	if rec := post(svc, "bob"); rec.Code != 429 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("bob, denied: %d %s", rec.Code, rec.Body)
	}
	if rec := post(svc, "alice"); rec.Code != 200 {
		t.Fatalf("alice: %d %s", rec.Code, rec.Body)
	}
	// The settlement runs off the response path: wait for it.
	for i := 0; ; i++ {
		r, _ := qp.Reservation("r_1")
		if r.State == client.StateCommitted {
			if r.Used != 39 || r.User != "alice" {
				t.Errorf("reservation %+v, want alice's 39 tokens committed", r)
			}
			break
		}
		if i > 200 {
			t.Fatalf("reservation r_1 is %s", r.State)
		}
		<-timeAfter()
	}
}

func timeAfter() <-chan time.Time { return time.After(10 * time.Millisecond) }
