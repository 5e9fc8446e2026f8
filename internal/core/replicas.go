package core

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
)

// confirmReplicas waits until Config.MinReplicas replicas acknowledged the
// grant of l, at most Config.ReplicaTimeout. WAIT covers the writes of the
// connection it is sent on, and a grant may have been written by another
// connection (a fair grant made by someone's release), so it renews the
// lease first on one dedicated connection to the primary that owns the
// semaphore's slot, then sends WAIT there: the replication stream is in
// order, so a replica that acknowledged the renewal has the grant too. When
// too few replicas acknowledge, or the check itself fails, the lease is
// released and the error returned.
func (e *Engine) confirmReplicas(ctx context.Context, l *Lease) error {
	// WAIT on a dedicated connection honours no context: bound it.
	err := boundedErr(ctx, func() error { return e.waitReplicas(ctx, l) })
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		err = e.ctxErr(ctx, nil)
	}
	if err == nil {
		return nil
	}
	// Hand the slot back: within the caller's context while it runs, else
	// (or if that failed) detached, without waiting; a release that cannot
	// run leaves a grant that expires.
	if ctx.Err() == nil && l.Release(ctx) == nil {
		return err
	}
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = l.Release(cctx)
	}()
	return err
}

func (e *Engine) waitReplicas(ctx context.Context, l *Lease) error {
	var node *redis.Client
	switch c := e.cfg.Client.(type) {
	case *redis.Client:
		node = c
	case *redis.ClusterClient:
		var err error
		if node, err = c.MasterForKey(ctx, e.keys.List[0]); err != nil {
			return e.wrap(err)
		}
	default: // rejected by validate
		return e.wrap(fmt.Errorf("MinReplicas with %T", e.cfg.Client))
	}
	conn := node.Conn()
	defer conn.Close()
	ok, _, err := e.renewOn(ctx, conn, l.id)
	if err != nil {
		return err
	}
	if !ok {
		l.markLost()
		return redsem.ErrLeaseLost
	}
	n, err := conn.Wait(ctx, e.cfg.MinReplicas, e.cfg.ReplicaTimeout).Result()
	if err != nil {
		return e.wrap(err)
	}
	if int(n) < e.cfg.MinReplicas {
		return &redsem.ReplicationError{Name: e.cfg.Name, Want: e.cfg.MinReplicas, Got: int(n), Timeout: e.cfg.ReplicaTimeout}
	}
	return nil
}

// replicated applies confirmReplicas to a fresh grant, if configured.
func (e *Engine) replicated(ctx context.Context, l redsem.Lease, err error) (redsem.Lease, error) {
	if err != nil || e.cfg.MinReplicas <= 0 {
		return l, err
	}
	lease, ok := l.(*Lease)
	if !ok {
		return l, nil
	}
	if err := e.confirmReplicas(ctx, lease); err != nil {
		if errors.Is(err, redsem.ErrLeaseLost) || errors.Is(err, redsem.ErrNotReplicated) {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, e.ctxErr(ctx, err)
		}
		return nil, err
	}
	return l, nil
}
