package redsemotel

import (
	"runtime/debug"
	"testing"
)

// versionOf takes the version of the module that holds the package: its
// own module once split off, else the root module, as a dependency or as
// the main module; "(devel)" when there is none.
func TestVersionOf(t *testing.T) {
	dep := func(path, v string) *debug.Module { return &debug.Module{Path: path, Version: v} }
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{"no build info", nil, false, "(devel)"},
		{"a dependency", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app", Version: "(devel)"},
			Deps: []*debug.Module{dep("go.opentelemetry.io/otel", "v1.44.0"), dep("github.com/redsem/redsem", "v1.3.0")}}, true, "v1.3.0"},
		{"its own module first", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{dep("github.com/redsem/redsem", "v1.3.0"), dep("github.com/redsem/redsem/redsemotel", "v0.4.1")}}, true, "v0.4.1"},
		{"replaced by a fork", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: "github.com/redsem/redsem", Version: "v1.3.0", Replace: dep("example.com/fork", "v1.3.1-fix")}}}, true, "v1.3.1-fix"},
		{"replaced by a directory", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{{Path: "github.com/redsem/redsem", Version: "v1.3.0", Replace: &debug.Module{Path: "../redsem"}}}}, true, "v1.3.0"},
		{"the main module, stamped", &debug.BuildInfo{Main: debug.Module{Path: "github.com/redsem/redsem", Version: "v0.0.0-20261204161722-edd51de1a2b3+dirty"}}, true, "v0.0.0-20261204161722-edd51de1a2b3+dirty"},
		{"the main module, not stamped", &debug.BuildInfo{Main: debug.Module{Path: "github.com/redsem/redsem", Version: "(devel)"}}, true, "(devel)"},
		{"the main module, empty", &debug.BuildInfo{Main: debug.Module{Path: "github.com/redsem/redsem"}}, true, "(devel)"},
		{"absent", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"}}, true, "(devel)"},
	} {
		if got := versionOf(c.bi, c.ok); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if Version() == "" {
		t.Error("Version is empty")
	}
}
