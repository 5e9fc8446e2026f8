package redistest

import (
	"context"
	"os"
)

// Container, when set, runs Redis in a container and returns its address
// and a function that removes it. It is the shared server's last resort,
// tried only when no redis-server is on PATH and neither REDIS_URL nor
// REDSEM_REDIS_SERVER is set. The module
// github.com/redsem/redsem/internal/testkit/container sets it (through
// testcontainers-go) when a test binary imports it; it lives in a module of
// its own so that the Docker client stays out of the core module's graph,
// which every user of fair and unfair downloads.
var Container func(ctx context.Context) (addr string, stop func(), err error)

// startContainer runs Redis through Container, if a test module set it.
func startContainer() (*Server, error) {
	if Container == nil {
		return nil, os.ErrNotExist
	}
	addr, stop, err := Container(context.Background())
	if err != nil {
		return nil, err
	}
	return &Server{Addr: addr, external: true, stopFn: stop}, nil
}
