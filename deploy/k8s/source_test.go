package k8s_test

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// What the manifests are checked against is read from the main module's sources, two
// directories up: the variables internal/config reads, the paths each binary serves,
// and the binaries the Dockerfile installs.
const root = "../.."

// binary is what a container runs, as the sources say.
type binary struct {
	name    string          // quotaplane-api
	cmd     string          // its main package: cmd/api
	loader  string          // the internal/config function its main calls: LoadAPI
	addrVar string          // the variable of the address it serves paths on
	env     map[string]bool // every variable its loader reads
	paths   map[string]bool // the GET paths it serves on addrVar
	open    map[string]bool // of those, the ones that need no credentials
}

// source is everything the checks need from the main module, read once per test.
type source struct {
	binaries   map[string]*binary // by path in the image: /usr/local/bin/quotaplane-api
	entrypoint string             // the image's default command
	defaults   map[string]string  // a variable's default as Go source: "60 * time.Second"
}

func readSource(t *testing.T) *source {
	t.Helper()
	s := &source{binaries: map[string]*binary{}}
	api := &binary{name: "quotaplane-api", cmd: "cmd/api", loader: "LoadAPI", addrVar: "QUOTA_HTTP_ADDR"}
	worker := &binary{name: "quotaplane-worker", cmd: "cmd/worker", loader: "LoadWorker", addrVar: "QUOTA_WORKER_HTTP_ADDR"}

	// The Dockerfile builds each binary from its cmd directory and copies them all
	// into one directory; its entrypoint is what a container without a command runs.
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	built := map[string]string{}
	for _, m := range regexp.MustCompile(`-o /out/(\S+) \./(cmd/\S+)`).FindAllStringSubmatch(string(df), -1) {
		built[m[1]] = m[2]
	}
	copyTo := regexp.MustCompile(`(?m)^COPY --from=build /out/ (\S+)/$`).FindStringSubmatch(string(df))
	entry := regexp.MustCompile(`(?m)^ENTRYPOINT (\[.*\])$`).FindStringSubmatch(string(df))
	if copyTo == nil || entry == nil {
		t.Fatalf("Dockerfile: no COPY --from=build /out/ <dir>/ or no ENTRYPOINT [...]")
	}
	var ep []string
	if err := json.Unmarshal([]byte(entry[1]), &ep); err != nil || len(ep) == 0 {
		t.Fatalf("Dockerfile ENTRYPOINT %s: %v", entry[1], err)
	}
	s.entrypoint = ep[0]
	for _, b := range []*binary{api, worker} {
		if built[b.name] != b.cmd {
			t.Fatalf("Dockerfile builds %v, not %s from ./%s", built, b.name, b.cmd)
		}
		s.binaries[copyTo[1]+"/"+b.name] = b
		mustCall(t, filepath.Join(root, b.cmd, "main.go"), "config."+b.loader, "")
		mustCall(t, filepath.Join(root, b.cmd, "main.go"), "config.Listen", b.addrVar)
	}

	reads, defaults := configReads(t)
	s.defaults = defaults
	api.env, worker.env = reads["LoadAPI"], reads["LoadWorker"]

	api.paths = servedPaths(t, filepath.Join(root, "internal/httpapi/routes.go"), "Get")
	worker.paths = servedPaths(t, filepath.Join(root, worker.cmd, "main.go"), "HandleFunc", "Handle")
	api.open = openPaths(t)
	// The api's /metrics is a route of the table but 404 on QUOTA_HTTP_ADDR unless
	// QUOTA_METRICS_ADDR=public; it is served on QUOTA_METRICS_ADDR's port
	// (metricsPort).
	delete(api.paths, "/metrics")
	worker.open = worker.paths // the worker checks no credentials
	return s
}

func parse(t *testing.T, file string) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// mustCall fails unless file calls pkg.Fn, with a first argument equal to arg when
// arg is set.
func mustCall(t *testing.T, file, fn, arg string) {
	t.Helper()
	found := false
	ast.Inspect(parse(t, file), func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || found {
			return !found
		}
		if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
			if x, ok := sel.X.(*ast.Ident); ok && x.Name+"."+sel.Sel.Name == fn {
				found = arg == "" || (len(call.Args) > 0 && stringLit(call.Args[0]) == arg)
			}
		}
		return true
	})
	if !found {
		t.Fatalf("%s does not call %s(%q, ...)", file, fn, arg)
	}
}

func stringLit(e ast.Expr) string {
	lit, ok := e.(*ast.BasicLit)
	if !ok || lit.Kind != token.STRING {
		return ""
	}
	s, err := strconv.Unquote(lit.Value)
	if err != nil {
		return ""
	}
	return s
}

// configReads finds, in internal/config, the environment variables each function
// reads, directly or through the functions it calls: a read is a call of getenv (the
// loaders' parameter or the reader's field) or of a function that passes one of its
// parameters on to a read (reader.str, reader.duration, ...). The key must be a string
// literal or such a parameter; anything else fails the test rather than be missed.
// It also returns each variable's default argument, as Go source.
func configReads(t *testing.T) (map[string]map[string]bool, map[string]string) {
	t.Helper()
	dir := filepath.Join(root, "internal/config")
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string]*ast.FuncDecl{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		for _, d := range parse(t, f).Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
				funcs[fd.Name.Name] = fd
			}
		}
	}
	calleeName := func(call *ast.CallExpr) string {
		switch fn := call.Fun.(type) {
		case *ast.Ident:
			return fn.Name
		case *ast.SelectorExpr:
			// r.str(...) or r.getenv(...), not strings.TrimSpace(...)
			if _, ok := fn.X.(*ast.Ident); ok && (funcs[fn.Sel.Name] != nil || fn.Sel.Name == "getenv") {
				return fn.Sel.Name
			}
		}
		return ""
	}
	params := func(fd *ast.FuncDecl) []string {
		var names []string
		for _, field := range fd.Type.Params.List {
			for _, n := range field.Names {
				names = append(names, n.Name)
			}
		}
		return names
	}
	// keyArg: the functions that read the variable named by their argument i.
	keyArg := map[string]int{"getenv": 0}
	for changed := true; changed; {
		changed = false
		for name, fd := range funcs {
			if _, ok := keyArg[name]; ok {
				continue
			}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				i, reads := keyArg[calleeName(call)]
				if !reads || len(call.Args) <= i {
					return true
				}
				if id, ok := call.Args[i].(*ast.Ident); ok {
					for j, p := range params(fd) {
						if p == id.Name {
							keyArg[name], changed = j, true
						}
					}
				}
				return true
			})
		}
	}
	direct := map[string]map[string]bool{}
	calls := map[string][]string{}
	defaults := map[string]string{}
	for name, fd := range funcs {
		direct[name] = map[string]bool{}
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			callee := calleeName(call)
			if funcs[callee] != nil {
				calls[name] = append(calls[name], callee)
			}
			i, reads := keyArg[callee]
			if !reads {
				return true
			}
			if key := stringLit(call.Args[i]); key != "" {
				direct[name][key] = true
				if len(call.Args) > i+1 {
					defaults[key] = exprSource(call.Args[i+1])
				}
				return true
			}
			if id, ok := call.Args[i].(*ast.Ident); ok {
				if j, passes := keyArg[name]; passes && params(fd)[j] == id.Name {
					return true // its own key passed on: counted where the literal is
				}
			}
			t.Errorf("internal/config: %s calls %s with a key that is neither a string literal nor its parameter: "+
				"this test cannot tell which variable it reads", name, callee)
			return true
		})
	}
	reach := func(from string) map[string]bool {
		out, seen := map[string]bool{}, map[string]bool{}
		var walk func(string)
		walk = func(fn string) {
			if seen[fn] {
				return
			}
			seen[fn] = true
			for k := range direct[fn] {
				out[k] = true
			}
			for _, c := range calls[fn] {
				walk(c)
			}
		}
		walk(from)
		return out
	}
	reads := map[string]map[string]bool{}
	for _, loader := range []string{"LoadAPI", "LoadWorker"} {
		if funcs[loader] == nil {
			t.Fatalf("internal/config has no %s", loader)
		}
		reads[loader] = reach(loader)
		if len(reads[loader]) == 0 {
			t.Fatalf("found no variable read by config.%s", loader)
		}
	}
	return reads, defaults
}

func exprSource(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		return e.Value
	case *ast.SelectorExpr:
		return exprSource(e.X) + "." + e.Sel.Name
	case *ast.Ident:
		return e.Name
	case *ast.BinaryExpr:
		return exprSource(e.X) + " " + e.Op.String() + " " + exprSource(e.Y)
	}
	return fmt.Sprintf("%T", e)
}

// durationDefault evaluates a default written as N * time.Unit or time.Unit.
func durationDefault(src string) (time.Duration, error) {
	units := map[string]time.Duration{"time.Millisecond": time.Millisecond, "time.Second": time.Second, "time.Minute": time.Minute}
	if u, ok := units[src]; ok {
		return u, nil
	}
	n, unit, ok := strings.Cut(src, " * ")
	v, err := strconv.Atoi(n)
	if u, known := units[unit]; ok && err == nil && known {
		return time.Duration(v) * u, nil
	}
	return 0, fmt.Errorf("cannot evaluate the default %q", src)
}

// servedPaths are the literal GET paths registered in file through the methods
// named: r.Get("/healthz", ...) or mux.HandleFunc("GET /healthz", ...); with "Get",
// also the rows of a route table, {get, "/healthz", ...} (internal/httpapi/routes.go).
func servedPaths(t *testing.T, file string, methods ...string) map[string]bool {
	t.Helper()
	paths := map[string]bool{}
	ast.Inspect(parse(t, file), func(n ast.Node) bool {
		if row, ok := n.(*ast.CompositeLit); ok && len(row.Elts) >= 2 && slices.Contains(methods, "Get") {
			if id, ok := row.Elts[0].(*ast.Ident); ok && id.Name == "get" {
				if p := stringLit(row.Elts[1]); strings.HasPrefix(p, "/") {
					paths[p] = true
				}
			}
			return true
		}
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		for _, m := range methods {
			if sel.Sel.Name != m {
				continue
			}
			p := stringLit(call.Args[0])
			if after, ok := strings.CutPrefix(p, "GET "); ok {
				p = after
			} else if m != "Get" && strings.Contains(p, " ") {
				continue // another method
			}
			if strings.HasPrefix(p, "/") {
				paths[p] = true
			}
		}
		return true
	})
	if len(paths) == 0 {
		t.Fatalf("%s: found no GET path", file)
	}
	return paths
}

// openPaths are the api's GET operations that need no credentials (security: [] in
// api/openapi.yaml): a probe sends none.
func openPaths(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "api/openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := yaml.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	open := map[string]bool{}
	for p, ops := range spec.Paths {
		var get struct {
			Security *[]any `json:"security"`
		}
		if raw, ok := ops["get"]; ok && json.Unmarshal(raw, &get) == nil && get.Security != nil && len(*get.Security) == 0 {
			open[p] = true
		}
	}
	return open
}
