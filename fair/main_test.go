package fair_test

import (
	"os"
	"testing"

	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		// Re-executed by startChild: play a waiting process, not the tests.
		os.Exit(childMain())
	}
	os.Exit(redistest.MainNoLeaks(m))
}
