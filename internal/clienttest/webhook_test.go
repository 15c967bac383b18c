package clienttest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/client"
	"github.com/quotaplane/quotaplane/client/webhook"
)

// The client's webhook.Verify accepts what the real worker delivers, signed with the
// secret the API shows the org, and refuses it changed or under another secret.
func TestWebhookVerifyOfTheWorkersDelivery(t *testing.T) {
	type delivery struct {
		header, event, id string
		body              []byte
	}
	got := make(chan delivery, 10)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- delivery{r.Header.Get(webhook.SignatureHeader), r.Header.Get(webhook.EventHeader), r.Header.Get(webhook.DeliveryHeader), body}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer recv.Close()
	e := newEnv(t, `,"webhook_url":"`+recv.URL+`/hook"`)
	var settings struct {
		SigningSecret string `json:"signing_secret"`
	}
	e.decode(e.op("GET", "/v1/orgs/"+e.org+"/webhook", "", 200), &settings)
	if settings.SigningSecret == "" {
		t.Fatal("no signing secret")
	}

	// 850 of the org's 1000 tokens a month: the worker's flush records the 80 %
	// threshold and delivers it.
	res, err := e.client().Check(context.Background(), client.CheckRequest{Org: e.org, Metric: "tokens", Cost: 850})
	if err != nil || !res.Allowed {
		t.Fatalf("Check = %+v, %v", res, err)
	}
	var d delivery
	select {
	case d = <-got:
	case <-time.After(30 * time.Second):
		t.Fatalf("no delivery within 30 s\n%s", e.st.Logs())
	}
	if d.event != "usage.threshold" || d.id == "" || !bytes.Contains(d.body, []byte(e.org)) {
		t.Errorf("delivery: event %q id %q body %s", d.event, d.id, d.body)
	}
	now := time.Now()
	if err := webhook.Verify(settings.SigningSecret, d.header, d.body, now, webhook.DefaultTolerance); err != nil {
		t.Errorf("Verify of the worker's delivery: %v (header %q)", err, d.header)
	}
	changed := bytes.Replace(d.body, []byte(e.org), []byte("evil"), 1)
	for _, tc := range []struct {
		name, secret, header string
		body                 []byte
		now                  time.Time
		want                 error
	}{
		{"body changed", settings.SigningSecret, d.header, changed, now, webhook.ErrMismatch},
		{"another secret", "another-org-secret", d.header, d.body, now, webhook.ErrMismatch},
		{"replayed an hour later", settings.SigningSecret, d.header, d.body, now.Add(time.Hour), webhook.ErrTimestamp},
		{"no header", settings.SigningSecret, "", d.body, now, webhook.ErrMalformed},
	} {
		if err := webhook.Verify(tc.secret, tc.header, tc.body, tc.now, webhook.DefaultTolerance); !errors.Is(err, tc.want) {
			t.Errorf("%s: Verify = %v, want %v", tc.name, err, tc.want)
		}
	}
}
