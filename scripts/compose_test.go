package scripts_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// compose is the part of docker-compose.yml these tests read.
type compose struct {
	Services map[string]struct {
		Environment map[string]string `yaml:"environment"`
		Ports       []any             `yaml:"ports"`
	} `yaml:"services"`
}

func readCompose(t *testing.T) compose {
	t.Helper()
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if len(c.Services) == 0 {
		t.Fatal("docker-compose.yml has no services")
	}
	return c
}

// required is compose's "${VAR:?message}": no value, no start.
var required = regexp.MustCompile(`^\$\{([A-Z0-9_]+):?\?[^}]+\}$`)

// A compose file that falls back to a known operator token or webhook secret opens
// every deployment that forgot to set them: secrets must be required, never defaulted.
func TestComposeHasNoDefaultSecrets(t *testing.T) {
	c := readCompose(t)
	seen := 0
	for name, svc := range c.Services {
		for key, value := range svc.Environment {
			if !strings.Contains(key, "TOKEN") && !strings.Contains(key, "SECRET") && !strings.Contains(key, "PASSWORD") {
				continue
			}
			seen++
			if m := required.FindStringSubmatch(value); m == nil || m[1] != key {
				t.Errorf("service %s: %s: %q, want ${%s:?message}: required from the environment, no default", name, key, value, key)
			}
		}
	}
	if seen == 0 {
		t.Error("no service reads QUOTA_ADMIN_TOKEN or QUOTA_WEBHOOK_SECRET")
	}
}

// Published ports are bound to loopback: the api speaks plain HTTP, and what reaches
// it from other machines goes through a proxy the operator chooses.
func TestComposePublishesOnLoopbackOnly(t *testing.T) {
	c := readCompose(t)
	for name, svc := range c.Services {
		for _, p := range svc.Ports {
			switch p := p.(type) {
			case string:
				if !strings.HasPrefix(p, "127.0.0.1:") && !strings.HasPrefix(p, "[::1]:") {
					t.Errorf("service %s publishes %q on every interface, want 127.0.0.1:<host port>:<container port>", name, p)
				}
			case map[string]any:
				if ip, _ := p["host_ip"].(string); ip != "127.0.0.1" && ip != "::1" {
					t.Errorf("service %s publishes %v with host_ip %q, want 127.0.0.1", name, p, ip)
				}
			default:
				t.Errorf("service %s publishes %v (%T): a bare port is on every interface", name, p, p)
			}
		}
	}
}
