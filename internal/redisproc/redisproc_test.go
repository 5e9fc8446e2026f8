package redisproc_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/redisproc"
)

func TestStartStop(t *testing.T) {
	if _, err := redisproc.Binary(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := redisproc.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if p.Version() == "" {
		t.Errorf("no version reported")
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("server does not answer: %v", err)
	}
	p.Stop()
	p.Stop() // twice is fine
	if conn, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		conn.Close()
		t.Fatalf("server still listens on %s after Stop", p.Addr())
	}
}

func TestNotFound(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv(redisproc.EnvServer, "")
	_, err := redisproc.Start(context.Background())
	if !errors.Is(err, redisproc.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}

// TestEnvServer: REDSEM_REDIS_SERVER names the binary Start runs, by path
// (here a symlink to redis-server under another name); a name that cannot
// be found is an error that is not ErrNotFound, so that nothing stands in
// for the server asked for.
func TestEnvServer(t *testing.T) {
	real, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("no redis-server on PATH")
	}
	link := filepath.Join(t.TempDir(), "redis-server-under-test")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	t.Setenv(redisproc.EnvServer, link)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := redisproc.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if p.Path() != link {
		t.Errorf("Path() = %q, want %q", p.Path(), link)
	}

	t.Setenv(redisproc.EnvServer, filepath.Join(t.TempDir(), "no-such-server"))
	if _, err := redisproc.Start(ctx); err == nil || errors.Is(err, redisproc.ErrNotFound) {
		t.Fatalf("err = %v, want a failed lookup that is not ErrNotFound", err)
	}
}
