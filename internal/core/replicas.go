package core

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/bounds"
	"github.com/redsem/redsem/internal/core/wire"
	"github.com/redsem/redsem/internal/detach"
)

// confirmReplicas waits until Config.MinReplicas replicas acknowledged the
// grant of l, at most Config.ReplicaTimeout (nothing to do without
// MinReplicas). WAIT covers the writes of the connection it is sent on, and
// a grant may have been written by another connection (a fair grant made by
// someone's release), so it renews the lease first on one dedicated
// connection to the primary that owns the semaphore's slot, then sends WAIT
// there: the replication stream is in order, so a replica that acknowledged
// the renewal has the grant too. When too few replicas acknowledge, or the
// check itself fails, the lease is released and the error returned.
func (l *Lease) confirmReplicas(ctx context.Context) error {
	e := l.e
	if e.cfg.MinReplicas <= 0 {
		return nil
	}
	// WAIT on a dedicated connection honours no context: bound it.
	err := wire.BoundedErr(ctx, func() error { return l.waitReplicas(ctx) })
	if err == nil {
		return nil
	}
	// Hand the slots back: within the caller's context while it runs,
	// detached (bounded) once it ended; a release that cannot run leaves a
	// grant that expires.
	_ = detach.Release(ctx, l, bounds.ReplicaUndo)
	return err
}

// waitReplicas renews l on one connection to its primary, then waits
// there for MinReplicas replicas to acknowledge (WAIT).
func (l *Lease) waitReplicas(ctx context.Context) error {
	e := l.e
	var node *redis.Client
	switch c := e.cfg.Client.(type) {
	case *redis.Client:
		node = c
	case *redis.ClusterClient:
		var err error
		if node, err = c.MasterForKey(ctx, e.keys.List[0]); err != nil {
			e.rep.answered(time.Now(), err)
			return wire.Wrap(e.who(), err)
		}
	default: // rejected by validate
		return wire.Wrap(e.who(), fmt.Errorf("MinReplicas with %T", e.cfg.Client))
	}
	conn := node.Conn()
	defer conn.Close()
	r, err := e.door.Renew(ctx, conn, l.id, false)
	if err != nil {
		return err
	}
	if !r.OK {
		l.markLost()
		return redsem.ErrLeaseLost
	}
	n, err := conn.Wait(ctx, e.cfg.MinReplicas, e.cfg.ReplicaTimeout).Result()
	if err != nil {
		e.rep.answered(time.Now(), err)
		return wire.Wrap(e.who(), err)
	}
	if int(n) < e.cfg.MinReplicas {
		return &redsem.ReplicationError{Name: e.cfg.Name, Family: e.familyName(), Want: e.cfg.MinReplicas, Got: int(n), Timeout: e.cfg.ReplicaTimeout}
	}
	return nil
}
