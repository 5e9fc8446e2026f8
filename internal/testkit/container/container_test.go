package container

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/redsem/redsem/internal/testkit/redistest"
)

func TestImportSetsRedistestContainer(t *testing.T) {
	if redistest.Container == nil {
		t.Fatal("importing the package did not set redistest.Container")
	}
}

// Without a Docker engine configured, Start refuses at once instead of
// dialing one (the shared server's fallback must not stall a test binary).
func TestStartWithoutEngine(t *testing.T) {
	if _, err := os.Stat("/var/run/docker.sock"); err == nil {
		t.Skip("a Docker socket is here")
	}
	t.Setenv("DOCKER_HOST", "")
	t.Setenv("TESTCONTAINERS_ENABLED", "")
	_, stop, err := Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no Docker engine") || stop != nil {
		t.Fatalf("Start without an engine: %v (stop %v), want the no-engine error", err, stop != nil)
	}
}
