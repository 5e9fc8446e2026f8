package faults_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/testkit/redistest"
	"github.com/redsem/redsem/unfair"
)

// replicated builds a semaphore of variant v with MinReplicas and ReplicaTimeout.
func replicated(t *testing.T, v variant, c redis.UniversalClient, name string, limit, minReplicas int, timeout time.Duration) closer {
	t.Helper()
	return v.new(t, c, name, limit, opts{LeaseTTL: 5 * time.Second, QueueTTL: 2 * time.Second,
		Fallback: 200 * time.Millisecond, MinReplicas: minReplicas, ReplicaTimeout: timeout})
}

// With MinReplicas, a grant is returned only once a replica acknowledged
// it. Asking for more replicas than exist, or stalling the replica with
// SIGSTOP, makes acquire fail with ErrNotReplicated after ReplicaTimeout,
// and the slot is released again (nothing is left held).
func TestMinReplicas(t *testing.T) {
	skipShort(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			primary := redistest.Start(t)
			replica := primary.StartReplica(t)
			c := primary.Client(t)
			rc := replica.Client(t)
			ctx := redistest.Ctx(t, 60*time.Second)
			name := redistest.Name(t)
			// Generous: on a loaded machine a healthy replica may take
			// hundreds of milliseconds to acknowledge.
			const timeout = 2 * time.Second
			one := replicated(t, v, c, name, 2, 1, timeout)
			two := replicated(t, v, c, name, 2, 2, timeout)

			l, err := one.TryAcquire(ctx)
			if err != nil {
				t.Fatalf("TryAcquire with one replica required: %v", err)
			}
			// The grant is on the replica once TryAcquire returned.
			if st, err := statusOf(ctx, rc, name); err != nil || len(st.Holders) != 1 || st.Holders[0].ID != l.ID() {
				t.Fatalf("grant not on the replica: holders %+v, %v", st.Holders, err)
			}

			_, err = two.TryAcquire(ctx)
			var re *redsem.ReplicationError
			if !errors.Is(err, redsem.ErrNotReplicated) || !errors.As(err, &re) || re.Want != 2 || re.Got != 1 {
				t.Fatalf("TryAcquire with two replicas required: %v, want a ReplicationError 1 of 2", err)
			}
			expectHolders(t, ctx, one, l.ID())

			// A fair grant made by another client's release is confirmed too.
			filler, err := one.TryAcquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := acquireAsync(ctx, one)
			if v.fair {
				eventually(t, 10*time.Second, "waiter queued", func() error {
					if n, err := waitersOf(ctx, one); err != nil || n != 1 {
						return errorf("%d waiters, %v", n, err)
					}
					return nil
				})
			}
			if err := filler.Release(ctx); err != nil {
				t.Fatal(err)
			}
			w := await(t, got, 10*time.Second, "replicated waiter")

			replica.Pause(t)
			if err := w.Release(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = one.Acquire(ctx)
			if !errors.Is(err, redsem.ErrNotReplicated) {
				t.Fatalf("Acquire with the replica stopped: %v, want ErrNotReplicated", err)
			}
			expectHolders(t, ctx, one, l.ID())
			replica.Resume(t)
			eventually(t, 10*time.Second, "acquire after the replica resumed", func() error {
				x, err := one.TryAcquire(ctx)
				if err != nil {
					return err
				}
				return x.Release(ctx)
			})
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// New rejects a negative MinReplicas or ReplicaTimeout, and MinReplicas with
// a client on which WAIT cannot be tied to the grant's primary (a Ring).
func TestMinReplicasConfig(t *testing.T) {
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = plain.Close() })
	cases := []struct {
		name   string
		client redis.UniversalClient
		min    int
		wait   time.Duration
		field  string
	}{
		{"negative count", plain, -1, 0, "Options.MinReplicas"},
		{"negative timeout", plain, 1, -time.Second, "Options.ReplicaTimeout"},
		{"ring", ring, 1, 0, "Options.MinReplicas"},
	}
	for _, tc := range cases {
		_, errU := unfair.New(tc.client, "x", 1, unfair.Options{MinReplicas: tc.min, ReplicaTimeout: tc.wait})
		_, errF := fair.New(tc.client, "x", 1, fair.Options{MinReplicas: tc.min, ReplicaTimeout: tc.wait})
		for _, err := range []error{errU, errF} {
			var ce *redsem.ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Errorf("%s: %v, want a ConfigError for %s", tc.name, err, tc.field)
			}
		}
	}
	if _, err := unfair.New(ring, "x", 1, unfair.Options{}); err != nil {
		t.Errorf("ring without MinReplicas: %v", err)
	}
}
