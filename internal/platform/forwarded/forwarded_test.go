package forwarded_test

import (
	"crypto/tls"
	"net/http/httptest"
	"testing"

	"github.com/quotaplane/quotaplane/internal/platform/forwarded"
)

func TestClientIPAndHTTPS(t *testing.T) {
	p, err := forwarded.Parse("10.0.0.0/8, 127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, peer, xff, proto string
		tls                    bool
		wantIP                 string
		wantHTTPS              bool
	}{
		{"direct client", "203.0.113.5:1000", "", "", false, "203.0.113.5", false},
		{"direct client's headers are ignored", "203.0.113.5:1000", "198.51.100.1", "https", false, "203.0.113.5", false},
		{"direct TLS", "203.0.113.5:1000", "", "", true, "203.0.113.5", true},
		{"through a trusted proxy", "10.1.1.1:1000", "198.51.100.1", "https", false, "198.51.100.1", true},
		{"through two trusted proxies", "127.0.0.1:1000", "198.51.100.1, 10.2.2.2", "https,http", false, "198.51.100.1", true},
		{"a made-up hop left of the client is not believed", "10.1.1.1:1000", "192.0.2.66, 198.51.100.1", "", false, "198.51.100.1", false},
		{"garbage stops at the hop before it", "10.1.1.1:1000", "198.51.100.1, nonsense", "http", false, "10.1.1.1", false},
		{"only trusted hops: the leftmost", "10.1.1.1:1000", "10.3.3.3", "", false, "10.3.3.3", false},
		{"IPv4-mapped IPv6 peer", "[::ffff:10.1.1.1]:1000", "198.51.100.1", "", false, "198.51.100.1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			if tc.xff != "" {
				r.Header.Set("X-Forwarded-For", tc.xff)
			}
			if tc.proto != "" {
				r.Header.Set("X-Forwarded-Proto", tc.proto)
			}
			if tc.tls {
				r.TLS = &tls.ConnectionState{}
			}
			if got := p.ClientIP(r).String(); got != tc.wantIP {
				t.Errorf("ClientIP = %s, want %s", got, tc.wantIP)
			}
			if got := p.HTTPS(r); got != tc.wantHTTPS {
				t.Errorf("HTTPS = %v, want %v", got, tc.wantHTTPS)
			}
		})
	}
}

func TestParseRefusesWhatIsNoAddress(t *testing.T) {
	for _, s := range []string{"10.0.0.0/33", "proxy.internal", "10.0.0.1:80"} {
		if _, err := forwarded.Parse(s); err == nil {
			t.Errorf("Parse(%q) = nil error", s)
		}
	}
	if p, err := forwarded.Parse(""); err != nil || p.String() != "" {
		t.Errorf("Parse(\"\") = %v, %v", p, err)
	}
}
