package readmetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// redisDB is the database of the test Redis this test owns: the README's org ids are
// fixed ("demo", "acme"), so its counters cannot share a keyspace with other tests.
const redisDB = 15

// readsRetryFor bounds how long a read waits for the worker (flush, webhooks).
const readsRetryFor = 30 * time.Second

// statusMark is what curl appends to each answer (through the .curlrc the test
// writes), so the test knows every status without changing a command.
var statusMark = regexp.MustCompile(`\n?<<<readme-status (\d{3})>>>`)

func TestREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the api and the worker")
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("the README test needs %s: %v", tool, err)
			}
			t.Skipf("the README test needs %s: %v", tool, err)
		}
	}
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	examples, holders, err := extract(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	if len(examples) == 0 {
		t.Fatal("no command of README.md talks to the API: is the extraction broken?")
	}

	svc := startService(t, root)
	values := map[string]string{"OP": svc.operatorToken, "KEY": svc.orgKey}
	env := append(os.Environ(), "CURL_HOME="+svc.curlHome)
	for _, h := range holders {
		v, ok := values[h.name]
		if !ok {
			t.Fatalf("README line %d: placeholder %s=... is unknown to this test; teach it in TestREADME's values", h.line, h.name)
		}
		env = append(env, h.name+"="+v)
	}

	for _, ex := range examples {
		cmd := apiAddr.ReplaceAllString(ex.command, svc.addr)
		want := wantStatus(ex.expected)
		deadline := time.Now().Add(readsRetryFor)
		for attempt := 1; ; attempt++ {
			out, stderr, statuses, err := runCommand(env, cmd)
			why := ""
			switch {
			case err != nil:
				why = fmt.Sprintf("the command failed: %v\n%s", err, stderr)
			case len(statuses) == 0:
				why = "curl reported no status"
			}
			for _, s := range statuses {
				if why != "" {
					break
				}
				if want != 0 && s != want {
					why = fmt.Sprintf("status %d, the README shows %d", s, want)
				} else if want == 0 && ex.expected == "" && (s < 200 || s > 299) {
					why = fmt.Sprintf("status %d: a command that shows no answer must succeed", s)
				} else if want == 0 && !strings.HasPrefix(ex.expected, "HTTP/") && (s < 200 || s > 299) {
					why = fmt.Sprintf("status %d, the README shows a successful answer", s)
				}
			}
			if why == "" && ex.expected != "" && !statusOnly.MatchString(strings.TrimSpace(ex.expected)) {
				why = matchAnswer(ex.expected, out)
			}
			if why == "" {
				break
			}
			if !isRead(ex.command) || time.Now().After(deadline) {
				t.Fatalf("README line %d: %s\ncommand:\n%s\nREADME shows:\n%s\ngot (after %d attempts):\n%s\napi log:\n%s\nworker log:\n%s",
					ex.line, why, ex.command, ex.expected, attempt, out, svc.apiLog.tail(), svc.workerLog.tail())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("ran %d README commands", len(examples))
}

// isRead reports whether a curl command only reads (no method, no body): safe to repeat.
func isRead(cmd string) bool {
	for _, f := range []string{" -X", " --request", " -d", " --data", " -F", " --form", " -T"} {
		if strings.Contains(cmd, f) {
			return false
		}
	}
	return true
}

// runCommand runs cmd with bash and returns its output without the status marks,
// and the statuses curl reported.
func runCommand(env []string, cmd string) (string, string, []int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-c", cmd)
	c.Env = env
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	var statuses []int
	for _, m := range statusMark.FindAllStringSubmatch(stdout.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		statuses = append(statuses, n)
	}
	return statusMark.ReplaceAllString(stdout.String(), ""), stderr.String(), statuses, err
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// service is a running api and worker on a fresh database, seeded like `make run`.
type service struct {
	addr          string // host:port of the api
	operatorToken string
	orgKey        string
	curlHome      string
	apiLog        *logBuffer
	workerLog     *logBuffer
}

func startService(t *testing.T, root string) *service {
	t.Helper()
	dir := t.TempDir()
	dbURL := testenv.PostgresURL(t)
	lockReadmeRun(t, dbURL)

	redisURL := ownRedis(t)
	s := &service{
		addr:          fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		operatorToken: "readme-op-" + randomHex(t, 12),
		curlHome:      filepath.Join(dir, "curl"),
		apiLog:        &logBuffer{},
		workerLog:     &logBuffer{},
	}
	if err := os.MkdirAll(s.curlHome, 0o700); err != nil {
		t.Fatal(err)
	}
	curlrc := "write-out = \"\\n<<<readme-status %{http_code}>>>\"\nmax-time = 20\n"
	if err := os.WriteFile(filepath.Join(s.curlHome, ".curlrc"), []byte(curlrc), 0o600); err != nil {
		t.Fatal(err)
	}
	env := append(cleanEnviron(),
		"DATABASE_URL="+dbURL, "REDIS_URL="+redisURL,
		"QUOTA_ADMIN_TOKEN="+s.operatorToken, "QUOTA_WEBHOOK_SECRET=readme-webhook-"+randomHex(t, 12),
		"QUOTA_HTTP_ADDR="+s.addr, fmt.Sprintf("QUOTA_WORKER_HTTP_ADDR=127.0.0.1:%d", testenv.FreePort(t)),
		"QUOTA_FLUSH_INTERVAL=200ms", "QUOTA_LOG_LEVEL=warn", "QUOTA_STARTUP_TIMEOUT=20s",
		// A machine busy with make test's -race builds can stall Redis past the 100 ms
		// default, and the demo plan fails open: the answer would say "degraded".
		"QUOTA_REDIS_TIMEOUT=2s")

	bin := filepath.Join(dir, "bin")
	for _, b := range []struct{ name, pkg string }{{"quotaplane-api", "./cmd/api"}, {"quotaplane-worker", "./cmd/worker"}} {
		build := exec.Command("go", "build", "-o", filepath.Join(bin, b.name), b.pkg)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}

	// The demo org as `make run` seeds it.
	state := filepath.Join(dir, "state")
	seed := exec.Command(filepath.Join(bin, "quotaplane-api"), "demo", "--state-dir", state)
	seed.Env = env
	if out, err := seed.CombinedOutput(); err != nil {
		t.Fatalf("quotaplane-api demo: %v\n%s", err, out)
	}
	key, err := os.ReadFile(filepath.Join(state, "demo-org-key"))
	if err != nil {
		t.Fatal(err)
	}
	s.orgKey = strings.TrimSpace(string(key))

	start(t, filepath.Join(bin, "quotaplane-worker"), env, s.workerLog)
	start(t, filepath.Join(bin, "quotaplane-api"), env, s.apiLog)
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + s.addr + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the api is not ready: %v\napi log:\n%s", err, s.apiLog.tail())
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s
}

// cleanEnviron is the test's environment without the settings of the binaries, so a
// developer's QUOTA_REDIS_POOLS or REDIS_CLUSTER cannot reach the api under test.
func cleanEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "QUOTA_") || name == "DATABASE_URL" || name == "REDIS_URL" || name == "REDIS_CLUSTER" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// start runs a binary until the test ends, then stops it with SIGTERM.
func start(t *testing.T, path string, env []string, log *logBuffer) {
	t.Helper()
	c := exec.Command(path)
	c.Env = env
	c.Stdout, c.Stderr = log, log
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = c.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = c.Process.Kill()
			<-done
		}
	})
}

// lockReadmeRun holds a Postgres advisory lock until the test ends: the Redis
// database is this test's, one run at a time (the lead's make test and a worktree's).
func lockReadmeRun(t *testing.T, dbURL string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/postgres" // advisory locks are per database: one every run shares
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(7272015)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
}

// ownRedis returns the URL of redisDB on the test Redis, flushed.
func ownRedis(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(testenv.RedisURL(t))
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Query().Get("cluster") != "" {
		t.Skipf("the README test needs a plain redis:// URL to pick database %d: %q", redisDB, testenv.RedisURL(t))
	}
	u.Path = "/" + strconv.Itoa(redisDB)
	opt, err := redis.ParseURL(u.String())
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.FlushDB(context.Background()).Err(); err != nil {
		t.Fatalf("flush Redis database %d: %v", redisDB, err)
	}
	return u.String()
}

func randomHex(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// logBuffer keeps a process's output for a failure message.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.buf.String()
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return s
}
