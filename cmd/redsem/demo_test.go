package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redsem/redsem/internal/redisproc"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// pickRedis: --redis or REDIS_URL first, then a redis-server from PATH,
// then an in-process miniredis, and the first line says which. (The demo
// itself is not run on miniredis here: redsem's scripts do not run on it
// yet.)
func TestDemoPicksRedis(t *testing.T) {
	t.Setenv("REDIS_URL", "")
	ctx := context.Background()
	started := false
	startReal := func(ctx context.Context) (*redisproc.Proc, error) {
		started = true
		return redisproc.Start(ctx)
	}
	noServer := func(context.Context) (*redisproc.Proc, error) { return nil, redisproc.ErrNotFound }
	broken := func(context.Context) (*redisproc.Proc, error) { return nil, errors.New("exec format error") }
	pick := func(args []string, start func(context.Context) (*redisproc.Proc, error)) (string, error) {
		t.Helper()
		var out, errb bytes.Buffer
		c := newCommand("demo", "", "", &out, &errb)
		if _, code, stop := c.Parse(args, 0, ""); stop {
			t.Fatalf("parse %v: exit %d: %s", args, code, errb.String())
		}
		tg, line, stop, err := pickRedis(ctx, c, start)
		if err != nil {
			return "", err
		}
		defer stop()
		client := tg.Client()
		defer client.Close()
		if err := client.Ping(ctx).Err(); err != nil {
			t.Errorf("%v: the picked Redis does not answer PING: %v", args, err)
		}
		return line, nil
	}

	url := "redis://" + redistest.Shared(t).Addr
	if line, err := pick([]string{"--redis", url}, noServer); err != nil || !strings.HasPrefix(line, "redis: using "+url+" (from --redis)") {
		t.Errorf("--redis: %q, %v", line, err)
	}
	if _, err := pick([]string{"--redis", "nohostport"}, noServer); !errors.As(err, new(badTarget)) {
		t.Errorf("bad --redis: %v, want a badTarget", err)
	}
	t.Setenv("REDIS_URL", url)
	if line, err := pick(nil, noServer); err != nil || !strings.Contains(line, "(from REDIS_URL)") {
		t.Errorf("REDIS_URL: %q, %v", line, err)
	}
	t.Setenv("REDIS_URL", "")
	if line, err := pick(nil, noServer); err != nil || !strings.Contains(line, "in-process miniredis") {
		t.Errorf("no Redis at all: %q, %v; want the miniredis fallback", line, err)
	}
	if _, err := pick(nil, broken); err == nil || !strings.Contains(err.Error(), "exec format error") {
		t.Errorf("a redis-server that fails to start: %v; want its error, not the fallback", err)
	}
	if line, err := pick(nil, startReal); err == nil {
		if !started || !strings.HasPrefix(line, "redis: started redis-server") {
			t.Errorf("redis-server on PATH: %q", line)
		}
	} else if !errors.Is(err, redisproc.ErrNotFound) {
		t.Errorf("redis-server on PATH: %v", err)
	}
}
