package redsemotel

import (
	"runtime/debug"
	"sync"
)

// modulePaths are the paths of the module that holds this package, the
// most specific first: its own module, should it become one, else the
// root module.
var modulePaths = [...]string{ScopeName, "github.com/redsem/redsem"}

// develVersion is the version of a build whose module has none (a build
// inside the module's own repository, or without build information).
const develVersion = "(devel)"

// version is computed once: the build information does not change.
var version = sync.OnceValue(func() string { return versionOf(debug.ReadBuildInfo()) })

// Version is the version of the module that holds this package, the
// instrumentation scope's version: as the go command recorded it in the
// binary's build information (runtime/debug.ReadBuildInfo), e.g. "v1.2.3",
// or a pseudo-version for a commit; "(devel)" when the build has none, as
// in a build of this repository itself.
func Version() string { return version() }

// versionOf finds the module's version in the build information bi (ok:
// whether there is any).
func versionOf(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return develVersion
	}
	for _, path := range modulePaths {
		for _, m := range append([]*debug.Module{&bi.Main}, bi.Deps...) {
			if m == nil || m.Path != path {
				continue
			}
			v := m.Version
			if m.Replace != nil && m.Replace.Version != "" {
				v = m.Replace.Version
			}
			if v == "" {
				return develVersion
			}
			return v
		}
	}
	return develVersion
}
