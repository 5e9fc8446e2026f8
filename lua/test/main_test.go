// Package lua_test checks that the scripts run on miniredis, which users
// unit-test their own code with. It is a module of its own so that miniredis
// (and its Lua interpreter) stays out of the root module's requirements and
// so out of its users' module graphs.
package lua_test

import (
	"os"
	"testing"

	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestMain(m *testing.M) { os.Exit(redistest.MainNoLeaks(m)) }
