package faults_test

import (
	"testing"
	"time"

	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/lua"
)

// marker returns the bytes by which a proxy recognises a call of script s
// from sem: the function's name once sem's engine runs the scripts as
// functions, else the script's SHA1 (EVALSHA). It first waits until the
// engine knows which (the library's background load ended), so that the
// call a test then drops or holds is the one it means.
func marker(t *testing.T, sem redsem.Semaphore, s lua.Script) []byte {
	t.Helper()
	var e *core.Engine
	if c, ok := sem.(*core.Engine); ok {
		e = c
	} else if e = core.EngineOf(sem); e == nil {
		t.Fatalf("no engine behind %T", sem)
	}
	redistest.WaitFor(t, 5*time.Second, "the script mode settled", func() (bool, error) {
		return e.ScriptMode() != "pending", nil
	})
	if e.ScriptMode() == "fcall" {
		return []byte(s.Function())
	}
	return []byte(s.Hash())
}
