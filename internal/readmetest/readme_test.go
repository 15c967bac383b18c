package readmetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/internal/platform/testenv"
)

// redisDB is the database of the test Redis this test owns: the pages' org ids are
// fixed ("demo", "acme"), so its counters cannot share a keyspace with other tests.
const redisDB = 15

// readsRetryFor bounds how long a read waits for the worker (flush, webhooks).
const readsRetryFor = 30 * time.Second

// statusMark is what curl appends to each answer (through the .curlrc the test
// writes), so the test knows every status without changing a command.
var statusMark = regexp.MustCompile(`\n?<<<readme-status (\d{3})>>>`)

// TestMain removes the binaries testenv.StartStack builds.
func TestMain(m *testing.M) { testenv.Main(m) }

// pages are the files whose commands this test runs, in this order, against one
// fresh api and worker with the demo org: the README's check, money and LLM call, then
// the tour of the whole API, which a reader runs after the README on the same `make
// run`, so the tour's answers are those that come after the README's commands.
var pages = []string{"README.md", "docs/TOUR.md"}

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
	root := testenv.RepoRoot(t)
	svc := startService(t)
	for _, page := range pages {
		// A page builds on what the pages before it made: after a failure, stop.
		if !t.Run(strings.TrimSuffix(path.Base(page), ".md"), func(t *testing.T) { runPage(t, root, page, svc) }) {
			return
		}
	}
}

// runPage runs the commands of one page, in order, against svc, which the pages
// before it have already used.
func runPage(t *testing.T, root, page string, svc *service) {
	text, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(page)))
	if err != nil {
		t.Fatal(err)
	}
	examples, holders, err := extract(string(text))
	if err != nil {
		t.Fatalf("%s %v", page, err)
	}
	if len(examples) == 0 {
		t.Fatalf("no command of %s talks to the API: is the extraction broken?", page)
	}

	values := map[string]string{"OP": svc.OperatorToken, "KEY": svc.DemoKey}
	env := append(os.Environ(), "CURL_HOME="+svc.curlHome)
	for _, h := range holders {
		v, ok := values[h.name]
		if !ok {
			t.Fatalf("%s line %d: placeholder %s=... is unknown to this test; teach it in runPage's values", page, h.line, h.name)
		}
		env = append(env, h.name+"="+v)
	}

	for _, ex := range examples {
		cmd := apiAddr.ReplaceAllString(ex.command, svc.APIAddr)
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
					why = fmt.Sprintf("status %d, the page shows %d", s, want)
				} else if want == 0 && ex.expected == "" && (s < 200 || s > 299) {
					why = fmt.Sprintf("status %d: a command that shows no answer must succeed", s)
				} else if want == 0 && !strings.HasPrefix(ex.expected, "HTTP/") && (s < 200 || s > 299) {
					why = fmt.Sprintf("status %d, the page shows a successful answer", s)
				}
			}
			if why == "" && ex.expected != "" && !statusOnly.MatchString(strings.TrimSpace(ex.expected)) {
				why = matchAnswer(ex.expected, out)
			}
			if why == "" {
				break
			}
			if !isRead(ex.command) || time.Now().After(deadline) {
				t.Fatalf("%s line %d: %s\ncommand:\n%s\n%s shows:\n%s\ngot (after %d attempts):\n%s\napi log:\n%s\nworker log:\n%s",
					page, ex.line, why, ex.command, page, ex.expected, attempt, out, tail(svc.APILog.String()), tail(svc.WorkerLog.String()))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("ran %d commands of %s", len(examples), page)
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

// service is a running api and worker on a fresh database, seeded like `make run`,
// and the curl settings the pages' commands run with.
type service struct {
	*testenv.Stack
	curlHome string
}

func startService(t *testing.T) *service {
	t.Helper()
	s := &service{
		Stack:    testenv.StartStack(t, testenv.StackOptions{RedisDB: redisDB}),
		curlHome: filepath.Join(t.TempDir(), "curl"),
	}
	if err := os.MkdirAll(s.curlHome, 0o700); err != nil {
		t.Fatal(err)
	}
	curlrc := "write-out = \"\\n<<<readme-status %{http_code}>>>\"\nmax-time = 20\n"
	if err := os.WriteFile(filepath.Join(s.curlHome, ".curlrc"), []byte(curlrc), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// tail is the end of a log, for a failure message.
func tail(s string) string {
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return s
}
