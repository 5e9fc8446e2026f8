package redsem_test

// Tests of packaging promises that docs/promises.md listed as gaps: what a
// service that imports the module gets, seen by the go command.

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// goTool returns the go command of the toolchain that runs the tests.
func goTool(t *testing.T) string {
	t.Helper()
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command: %v", err)
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// goRun runs the go command in dir, outside the workspace and offline,
// failing the test on an error.
func goRun(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOPROXY=off", "GOFLAGS=-mod=mod", "GOTOOLCHAIN=local")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

// TestPromiseCoreRequiresOnlyGoRedisAndUUID: the core module requires only
// go-redis and uuid (its tests' needs included: go.mod lists them all),
// and each integration and the command are modules of their own (README
// §Install; design.md §Modules). .ci/run checks the first too.
func TestPromiseCoreRequiresOnlyGoRedisAndUUID(t *testing.T) {
	var mod struct {
		Require []struct {
			Path     string
			Indirect bool
		}
	}
	if err := json.Unmarshal([]byte(goRun(t, ".", "mod", "edit", "-json")), &mod); err != nil {
		t.Fatal(err)
	}
	var direct []string
	for _, r := range mod.Require {
		if !r.Indirect {
			direct = append(direct, r.Path)
		}
	}
	slices.Sort(direct)
	if want := []string{"github.com/google/uuid", "github.com/redis/go-redis/v9"}; !slices.Equal(direct, want) {
		t.Errorf("the core module requires %v, want only %v", direct, want)
	}
	for _, dir := range []string{"redsemotel", "redsemprom", "redsemsql", "redsempgx", "cmd/redsem"} {
		var m struct{ Module struct{ Path string } }
		if err := json.Unmarshal([]byte(goRun(t, dir, "mod", "edit", "-json")), &m); err != nil {
			t.Fatal(err)
		}
		if want := "github.com/redsem/redsem/" + dir; m.Module.Path != want {
			t.Errorf("%s/go.mod is module %q, want %q: a module of its own", dir, m.Module.Path, want)
		}
	}
}

// TestPromiseServiceModuleGraph: a service that imports fair lists 13
// modules in go list -m all: itself, redsem, uuid and the 10 that go-redis
// brings (README §Install). A scratch module in a temporary directory
// requires this tree (a replace line) and imports fair; go mod tidy and go
// list run offline (GOPROXY=off, outside the workspace), from the module
// cache that tidying this module fills, with this module's go.sum.
// (-e: offline, a module whose .info the cache lacks still lists its path).
func TestPromiseServiceModuleGraph(t *testing.T) {
	t.Parallel() // waits on TTLs and deadlines, with names of its own: beside the others
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	// The cache holds what go mod tidy of this module needs (go-redis's
	// test dependencies included) once tidy ran here, online as a user's
	// does; on a new machine nothing may have run it yet.
	tidy := exec.Command(goTool(t), "mod", "tidy", "-diff")
	tidy.Dir = root
	tidy.Env = append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local")
	if out, err := tidy.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy -diff in %s (fills the module cache): %v\n%s", root, err, out)
	}
	dir := t.TempDir()
	gomod := "module example.com/service\n\ngo 1.26.0\n\nrequire github.com/redsem/redsem v0.0.0\n\nreplace github.com/redsem/redsem => " + root + "\n"
	main := "package main\n\nimport _ \"github.com/redsem/redsem/fair\"\n\nfunc main() {}\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"go.mod": gomod, "main.go": main, "go.sum": string(sum)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) string {
		t.Helper()
		return goRun(t, dir, args...)
	}
	run("mod", "tidy")
	run("build", "./...")
	mods := strings.Fields(strings.TrimSpace(run("list", "-m", "-e", "-f", "{{.Path}}", "all")))
	t.Logf("go list -m all: %d modules: %s", len(mods), strings.Join(mods, " "))
	if len(mods) != 13 {
		t.Errorf("a service importing fair lists %d modules in go list -m all, want 13 (README §Install)", len(mods))
	}
	for _, want := range []string{"example.com/service", "github.com/redsem/redsem", "github.com/google/uuid", "github.com/redis/go-redis/v9"} {
		if !slices.Contains(mods, want) {
			t.Errorf("go list -m all lacks %s", want)
		}
	}
	for _, m := range mods {
		for _, not := range []string{"jackc/pgx", "opentelemetry", "prometheus", "testcontainers", "miniredis"} {
			if strings.Contains(m, not) {
				t.Errorf("a service importing fair has %s in its module graph", m)
			}
		}
	}
}
