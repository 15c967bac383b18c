package redisconn

import (
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	cases := []struct {
		in      string
		cluster bool
		single  string   // Addr of a single server
		seeds   []string // Addrs of a cluster
	}{
		{in: "redis://127.0.0.1:6379/0", single: "127.0.0.1:6379"},
		{in: "redis://127.0.0.1:7000", cluster: true, seeds: []string{"127.0.0.1:7000"}},
		{in: "127.0.0.1:7000,127.0.0.1:7001", seeds: []string{"127.0.0.1:7000", "127.0.0.1:7001"}},
		{in: " redis://:pw@a:7000 , redis://:pw@b:7001/ ", seeds: []string{"a:7000", "b:7001"}},
		{in: "redis://a:7000?cluster=true&addr=b:7001", seeds: []string{"a:7000", "b:7001"}},
		{in: "redis://a:7000?cluster=true&dial_timeout=1s", seeds: []string{"a:7000"}},
	}
	for _, c := range cases {
		o, err := Parse(c.in, c.cluster)
		if err != nil {
			t.Errorf("Parse(%q): %v", c.in, err)
			continue
		}
		switch {
		case c.single != "":
			if o.Single == nil || o.Single.Addr != c.single || o.Cluster != nil {
				t.Errorf("Parse(%q) = %+v, want the single server %s", c.in, o, c.single)
			}
		case o.Cluster == nil || !slices.Equal(o.Cluster.Addrs, c.seeds):
			t.Errorf("Parse(%q) = %+v, want a cluster with seeds %v", c.in, o, c.seeds)
		}
	}
	for _, bad := range []string{"", "http://x:1", "redis://a:7000,b", "redis://a:7000?cluster=true&bogus=1"} {
		if _, err := Parse(bad, false); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	o, _ := Parse("redis://:secret@a:7000", true)
	if o.Cluster == nil || o.Cluster.Password != "secret" {
		t.Errorf("cluster password not kept: %+v", o.Cluster)
	}
}

func TestCanonical(t *testing.T) {
	for in, want := range map[string]string{
		"redis://a:7000":              "redis://a:7000?cluster=true",
		"a:7000":                      "redis://a:7000?cluster=true",
		"redis://a:7000?db=0":         "redis://a:7000?db=0&cluster=true",
		"a:7000,b:7001":               "a:7000,b:7001",
		"redis://a:7000?cluster=true": "redis://a:7000?cluster=true",
	} {
		if got := Canonical(in, true); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", in, got, want)
		}
		if !IsCluster(Canonical(in, true)) {
			t.Errorf("Canonical(%q) is not a cluster address", in)
		}
	}
	if got := Canonical("redis://a:6379", false); got != "redis://a:6379" {
		t.Errorf("Canonical without cluster = %q", got)
	}
}

// New's errors never show the URL's password (url.Parse's message quotes the URL).
func TestNewErrorHidesPassword(t *testing.T) {
	for _, s := range []string{"redis://:s3cret@h:bad-port", "redis://u:s3cret@h:6379/not-a-db"} {
		_, err := New(s, false)
		if err == nil {
			t.Fatalf("New(%q) = nil error", s)
		}
		if strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "REDIS_URL") {
			t.Errorf("New(%q) = %q: shows the password or does not name REDIS_URL", s, err)
		}
	}
}
