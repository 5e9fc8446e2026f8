package redistest

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// startContainer runs Redis in a Docker container through testcontainers-go.
// It is the last resort, tried only when no redis-server is on PATH and
// neither REDIS_URL nor REDSEM_REDIS_SERVER is set, and only when a Docker
// engine seems to be reachable.
func startContainer() (*Server, error) {
	if !dockerEngineLikely() {
		return nil, errors.New("no Docker engine")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{
		ContainerRequest: testcontainers.ContainerRequest{
			Image:        "redis:7",
			Cmd:          []string{"redis-server", "--save", "", "--appendonly", "no"},
			ExposedPorts: []string{"6379/tcp"},
			WaitingFor:   wait.ForLog("Ready to accept connections"),
		},
		Started: true,
	})
	if err != nil {
		return nil, err
	}
	addr, err := c.PortEndpoint(ctx, "6379/tcp", "")
	if err != nil {
		_ = c.Terminate(context.Background())
		return nil, err
	}
	return &Server{Addr: addr, external: true, stopFn: func() {
		_ = c.Terminate(context.Background())
	}}, nil
}

// dockerEngineLikely reports whether a Docker engine socket or host is
// configured, so that machines without one do not wait on a failed dial.
func dockerEngineLikely() bool {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return true
	}
	if st, err := os.Stat("/var/run/docker.sock"); err == nil && st.Mode()&os.ModeSocket != 0 {
		return true
	}
	return strings.EqualFold(os.Getenv("TESTCONTAINERS_ENABLED"), "true")
}
