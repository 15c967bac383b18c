package clienttest

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// examples/go-service runs against the api: its checked route answers with
// RateLimit-* from Quotaplane, and refuses a request that names no caller.
func TestExampleService(t *testing.T) {
	e := newEnv(t, "")
	bin := filepath.Join(t.TempDir(), "go-service")
	build := exec.Command("go", "build", "-o", bin, "./examples/go-service")
	build.Dir = testenv.RepoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	svc := exec.Command(bin)
	svc.Env = append(os.Environ(), "QUOTAPLANE_URL="+e.url(), "QUOTAPLANE_KEY="+e.st.DemoKey, "ADDR="+addr)
	log := &testenv.Buffer{}
	svc.Stdout, svc.Stderr = log, log
	if err := svc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Process.Kill(); _ = svc.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if res, err := http.Get("http://" + addr + "/healthz"); err == nil {
			res.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("go-service did not start:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	res, body := get(t, "http://"+addr+"/search?q=quota", "alice")
	if res.StatusCode != 200 || body != "results for quota\n" || res.Header.Get("RateLimit-Limit") != "60" || res.Header.Get("RateLimit-Remaining") != "59" {
		t.Errorf("GET /search: %d %q %v\n%s", res.StatusCode, body, res.Header, log.String())
	}
	res, body = get(t, "http://"+addr+"/search", "")
	if res.StatusCode != 400 || !strings.Contains(body, "X-User") {
		t.Errorf("GET /search without X-User: %d %q", res.StatusCode, body)
	}
}
