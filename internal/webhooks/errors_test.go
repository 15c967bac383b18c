package webhooks_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
	"github.com/quotaplane/quotaplane/internal/webhooks"
)

// The delivery log (API and console) records each failure in the API's own words,
// never Go's dial errors, and none names an address of the worker's side (its
// resolver's, say: "dial tcp: lookup x on 10.0.0.2:53: ...").
func TestDeliveryErrorsAreInTheAPIsWords(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + closed.Addr().String() + "/hook"
	closed.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer slow.Close()
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer tlsSrv.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer failing.Close()

	// The timeout case's client gives up after 0.3 s; the others have 5 s, so that a
	// TLS handshake slowed by a busy machine (make test's -race packages beside this
	// one) still fails as a handshake, not a timeout (CI: "timed out after 0.3 s").
	short, long := webhooks.NewClient(300*time.Millisecond, true), webhooks.NewClient(5*time.Second, true)
	cases := []struct{ name, url, want string }{
		{"refused", refusedURL, "could not connect to the endpoint (connection refused)"},
		{"dns", "http://no-such-host.invalid/hook", "DNS lookup failed for no-such-host.invalid"},
		{"timeout", slow.URL + "/hook", "timed out after 0.3 s"},
		{"tls", tlsSrv.URL + "/hook", "TLS handshake failed"},
		{"answer", failing.URL + "/hook", "receiver answered 500"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			client := long
			if c.name == "timeout" {
				client = short
			}
			org := testenv.ID(t, "org")
			e.Seed(org, []vocab.Limit{monthLimit("requests", 10)}, nil, tenants.TeamInput{ID: "eng"})
			url := c.url
			if _, err := e.Svc.UpdateOrg(ctx, operator, org, tenants.OrgPatch{WebhookURL: &url}); err != nil {
				t.Fatal(err)
			}
			var id int64
			if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
				var err error
				id, err = webhooks.RecordEvent(ctx, tx, nil, org, webhooks.EventThreshold, "2026-11", "t-"+c.name, map[string]int{"x": 1}, true)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			d := &webhooks.Deliverer{Store: e.hooks, Tenants: e.Svc, Secret: master, Client: client}
			if err := d.Deliver(ctx, id, 1); err == nil {
				t.Fatal("the delivery succeeded")
			}
			ds, _, err := e.hooks.Deliveries(ctx, org, tenants.Page{Limit: 10})
			if err != nil || len(ds) != 1 {
				t.Fatalf("delivery log: %+v, %v", ds, err)
			}
			got := ds[0].Error
			if !strings.HasPrefix(got, c.want) {
				t.Errorf("logged error %q, want it to start %q", got, c.want)
			}
			if bad := internalWords(got); bad != "" {
				t.Errorf("logged error %q names %q", got, bad)
			}

			// A test send says the same.
			svc := &webhooks.Service{Store: e.hooks, Tenants: e.Svc, Secret: master, Client: client}
			res, err := svc.TestWebhook(ctx, org)
			if err != nil || !strings.HasPrefix(res.Error, c.want) || internalWords(res.Error) != "" {
				t.Errorf("test send: %+v, %v; want an error starting %q", res, err, c.want)
			}
		})
	}
}

// internalWords returns what in s is Go's wording or names the worker's side of a
// connection, or "".
func internalWords(s string) string {
	for _, w := range []string{"dial tcp", "lookup no-such", ":53", "read tcp", "write tcp", "Client.Timeout", "context deadline",
		"x509:", "tls:", "127.0.0.1:", "[::1]"} {
		if strings.Contains(s, w) {
			return w
		}
	}
	return ""
}

// A refused target that a host name resolved to is not named: the delivery log, a
// test send and its url_warning say only that the host is not public ("localhost"
// resolves to 127.0.0.1 or ::1 on any machine).
func TestPrivateTargetIsNotNamed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	org := testenv.ID(t, "org")
	e.Seed(org, []vocab.Limit{monthLimit("requests", 10)}, nil, tenants.TeamInput{ID: "eng"})
	url := "http://localhost:9/hook"
	if _, err := e.Svc.UpdateOrg(ctx, operator, org, tenants.OrgPatch{WebhookURL: &url}); err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := pgx.BeginFunc(ctx, e.Pool, func(tx pgx.Tx) error {
		var err error
		id, err = webhooks.RecordEvent(ctx, tx, nil, org, webhooks.EventThreshold, "2026-11", "t-private", map[string]int{"x": 1}, true)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	client := webhooks.NewClient(300*time.Millisecond, false)
	d := &webhooks.Deliverer{Store: e.hooks, Tenants: e.Svc, Secret: master, Client: client}
	if err := d.Deliver(ctx, id, 1); err == nil {
		t.Fatal("the delivery to a loopback address succeeded")
	}
	ds, _, err := e.hooks.Deliveries(ctx, org, tenants.Page{Limit: 10})
	if err != nil || len(ds) != 1 {
		t.Fatalf("delivery log: %+v, %v", ds, err)
	}
	svc := &webhooks.Service{Store: e.hooks, Tenants: e.Svc, Secret: master, Client: client}
	res, err := svc.TestWebhook(ctx, org)
	if err != nil {
		t.Fatal(err)
	}
	for where, text := range map[string]string{"delivery log": ds[0].Error, "test send": res.Error} {
		if !strings.Contains(text, "not a public address") {
			t.Errorf("%s: %q does not say the host is not public", where, text)
		}
		for _, addr := range []string{"127.0.0.1", "::1", ":9"} {
			if strings.Contains(text, addr) {
				t.Errorf("%s: %q names the resolved address %s", where, text, addr)
			}
		}
	}
}

// The IPv6 ranges that reach IPv4 or internal addresses are not public: local-use
// NAT64, 6to4 and Teredo.
func TestIPv6TransitionRangesAreNotPublic(t *testing.T) {
	for _, ip := range []string{"64:ff9b:1::a00:1", "64:ff9b::7f00:1", "2002:a00:1::1", "2002:c0a8:101::1", "2001:0:4136:e378::1"} {
		if webhooks.URLWarning("http://["+ip+"]/hook") == "" {
			t.Errorf("%s is taken for a public address", ip)
		}
	}
	for _, ip := range []string{"2606:4700::1111", "2001:db9::1", "2001:1::1"} {
		if w := webhooks.URLWarning("http://[" + ip + "]/hook"); w != "" {
			t.Errorf("%s is public, but: %s", ip, w)
		}
	}
}
