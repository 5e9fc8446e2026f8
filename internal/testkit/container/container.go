// Package container runs Redis in a Docker container through
// testcontainers-go, for test binaries on machines with a Docker engine and
// no redis-server. Importing it (for its effect) sets redistest.Container:
//
//	import _ "github.com/redsem/redsem/internal/testkit/container"
//
// It is a module of its own so that testcontainers-go and the Docker client
// it brings (about 60 modules) enter only the graphs of the test modules
// that import it (property_test), never the core module's, which every user
// of fair and unfair downloads.
package container

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/redsem/redsem/internal/testkit/redistest"
)

// Image is the image Start runs.
const Image = "redis:7"

func init() { redistest.Container = Start }

// Start runs Image with persistence off and returns the address its port is
// published on and a function that removes the container. It fails at once,
// without dialing, when no Docker engine seems to be configured.
func Start(ctx context.Context) (addr string, stop func(), err error) {
	if !engineLikely() {
		return "", nil, errors.New("container: no Docker engine (DOCKER_HOST, /var/run/docker.sock or TESTCONTAINERS_ENABLED=true)")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // may pull the image
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        Image,
			Cmd:          []string{"redis-server", "--save", "", "--appendonly", "no"},
			ExposedPorts: []string{"6379/tcp"},
			WaitingFor:   wait.ForLog("Ready to accept connections"),
		},
		Started: true,
	})
	if err != nil {
		return "", nil, err
	}
	stop = func() { _ = c.Terminate(context.Background()) }
	addr, err = c.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		stop()
		return "", nil, err
	}
	return addr, stop, nil
}

// engineLikely reports whether a Docker engine is configured, so that a
// machine without one does not wait on a failed dial.
func engineLikely() bool {
	if os.Getenv("DOCKER_HOST") != "" {
		return true
	}
	if st, err := os.Stat("/var/run/docker.sock"); err == nil && st.Mode()&os.ModeSocket != 0 {
		return true
	}
	return strings.EqualFold(os.Getenv("TESTCONTAINERS_ENABLED"), "true")
}
