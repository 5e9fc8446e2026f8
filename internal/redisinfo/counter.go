package redisinfo

import (
	"context"
	"net"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// CommandCounter is a go-redis hook that counts the commands a client sends:
// each command of a pipeline counts once, and a script call counts once per
// EVALSHA or EVAL sent (Redis counts the commands a script runs separately).
type CommandCounter struct{ n atomic.Int64 }

// N is the number of commands counted so far.
func (c *CommandCounter) N() int64 { return c.n.Load() }

// DialHook passes dials through.
func (c *CommandCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

// ProcessHook counts one command.
func (c *CommandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts each command of a pipeline.
func (c *CommandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}
