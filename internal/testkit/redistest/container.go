package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// containerImage is the image startContainer runs.
const containerImage = "redis:7"

// startContainer runs Redis in a Docker container through the docker
// command (not a Go Docker client: this package is in the root module, whose
// every requirement enters its users' module graphs). It is the last resort,
// tried only when no redis-server is on PATH and neither REDIS_URL nor
// REDSEM_REDIS_SERVER is set, and only when the docker command is there and
// a Docker engine seems to be reachable. The container publishes Redis on a
// loopback port that Docker picks, and is removed by Stop.
func startContainer() (*Server, error) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		return nil, err
	}
	if !dockerEngineLikely() {
		return nil, errors.New("no Docker engine")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // may pull the image
	defer cancel()
	id, err := runDocker(ctx, docker, "run", "--detach", "--rm", "--publish", "127.0.0.1::6379",
		containerImage, "redis-server", "--save", "", "--appendonly", "no")
	if err != nil {
		return nil, err
	}
	remove := func() { _, _ = runDocker(context.Background(), docker, "rm", "--force", id) }
	addr, err := containerAddr(ctx, docker, id)
	if err == nil {
		err = waitPing(ctx, addr)
	}
	if err != nil {
		remove()
		return nil, err
	}
	return &Server{Addr: addr, external: true, stopFn: remove}, nil
}

// runDocker runs docker with args and returns its output, trimmed; its
// error names the command and carries what docker wrote to stderr.
func runDocker(ctx context.Context, docker string, args ...string) (string, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, docker, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("docker %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// containerAddr returns the host:port on which container id publishes
// Redis's port ("docker port" prints one line per address, e.g.
// 127.0.0.1:32768).
func containerAddr(ctx context.Context, docker, id string) (string, error) {
	out, err := runDocker(ctx, docker, "port", id, "6379/tcp")
	if err != nil {
		return "", err
	}
	addr, _, _ := strings.Cut(out, "\n")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("docker port: %q: %w", out, err)
	}
	return addr, nil
}

// waitPing returns once the server at addr answers PING, or ctx's error.
func waitPing(ctx context.Context, addr string) error {
	c := redis.NewClient(clientOptions(addr).Simple())
	defer c.Close()
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redis in a container at %s did not answer: %w", addr, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dockerEngineLikely reports whether a Docker engine socket or host is
// configured, so that machines without one do not wait on a failed dial.
func dockerEngineLikely() bool {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return true
	}
	st, err := os.Stat("/var/run/docker.sock")
	return err == nil && st.Mode()&os.ModeSocket != 0
}
