package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// RepoRoot returns the repository's root: the nearest directory holding go.mod at or
// above the test's working directory (its package's directory), where README.md,
// api/openapi.yaml, deploy/ and docs/ are.
func RepoRoot(tb testing.TB) string {
	tb.Helper()
	wd, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for dir := wd; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatalf("testenv: no go.mod at or above %s", wd)
		}
		dir = parent
	}
}
