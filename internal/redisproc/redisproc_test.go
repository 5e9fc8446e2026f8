package redisproc_test

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/redisproc"
)

func TestStartStop(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server on PATH")
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
	_, err := redisproc.Start(context.Background())
	if !errors.Is(err, redisproc.ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
}
