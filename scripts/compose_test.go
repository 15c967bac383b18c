package scripts_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// compose is the part of docker-compose.yml these tests read.
type compose struct {
	Services map[string]struct {
		Environment map[string]string `yaml:"environment"`
		Ports       []any             `yaml:"ports"`
		Restart     string            `yaml:"restart"`
		ReadOnly    bool              `yaml:"read_only"`
		CapDrop     []string          `yaml:"cap_drop"`
		SecurityOpt []string          `yaml:"security_opt"`
		Command     []string          `yaml:"command"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
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

// The long-running services come back after a crash or a host reboot, the api and the
// worker say when they are healthy (with their own binary: the image has no shell or
// curl), and the worker's /metrics and /healthz are reachable on loopback.
func TestComposeRestartsAndChecksItsServices(t *testing.T) {
	c := readCompose(t)
	for name, svc := range c.Services {
		if name == "seed" { // one-shot: restarting it would seed forever
			if svc.Restart != "" && svc.Restart != "no" {
				t.Errorf("the one-shot seed restarts (%q)", svc.Restart)
			}
			continue
		}
		if svc.Restart != "unless-stopped" && svc.Restart != "always" {
			t.Errorf("service %s: restart %q, want unless-stopped", name, svc.Restart)
		}
		if len(svc.Healthcheck.Test) == 0 {
			t.Errorf("service %s has no healthcheck", name)
		}
	}
	for name, bin := range map[string]string{"api": "quotaplane-api", "worker": "quotaplane-worker"} {
		test := c.Services[name].Healthcheck.Test
		if len(test) < 3 || test[0] != "CMD" || test[1] != "/usr/local/bin/"+bin || test[2] != "healthcheck" {
			t.Errorf("service %s: healthcheck %q, want [CMD /usr/local/bin/%s healthcheck <url>]", name, test, bin)
		}
	}
	if len(c.Services["worker"].Ports) == 0 {
		t.Error("the worker's port (/healthz, /metrics) is not published")
	}
}

// `COPY . .` must not send make run's state (the operator token, the webhook secret,
// the console password), binaries or node_modules into the image's build.
func TestDockerignoreKeepsSecretsAndBuildOutputOut(t *testing.T) {
	b, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			have[strings.TrimSuffix(strings.TrimPrefix(line, "/"), "/")] = true
		}
	}
	for _, want := range []string{".quotaplane", "bin", "**/node_modules", ".git"} {
		if !have[want] {
			t.Errorf(".dockerignore does not list %s", want)
		}
	}
}

// Every service runs on a read-only root filesystem, without capabilities or
// privilege escalation, and the seed keeps the demo's secrets out of its logs.
func TestComposeServicesAreHardened(t *testing.T) {
	c := readCompose(t)
	for name, svc := range c.Services {
		if !svc.ReadOnly {
			t.Errorf("service %s: read_only is not true", name)
		}
		if len(svc.CapDrop) != 1 || svc.CapDrop[0] != "ALL" {
			t.Errorf("service %s: cap_drop %q, want [ALL]", name, svc.CapDrop)
		}
		if !slices.Contains(svc.SecurityOpt, "no-new-privileges:true") {
			t.Errorf("service %s: security_opt %q lacks no-new-privileges:true", name, svc.SecurityOpt)
		}
	}
	if cmd := c.Services["seed"].Command; !slices.Contains(cmd, "--hide-secrets") {
		t.Errorf("the seed's command %q prints the demo key to its logs: want --hide-secrets", cmd)
	}
}
