package redistest_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// TestProxyStall: with replies held, a command runs in Redis (another client
// sees its effect) while its caller waits; SetStall(false, false) delivers
// the reply, intact, on the same connection. With requests held, Redis does
// not see the command until the stall ends.
func TestProxyStall(t *testing.T) {
	srv := redistest.Shared(t)
	direct := srv.Client(t)
	p := redistest.StartProxy(t, srv.Addr)
	opt := srv.Options()
	opt.Addr = p.Addr
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := redistest.Ctx(t, 10*time.Second)
	key := redistest.Name(t)
	if err := c.Ping(ctx).Err(); err != nil { // the connection, made before the stall
		t.Fatal(err)
	}
	for _, requests := range []bool{false, true} {
		p.SetStall(requests, true)
		done := make(chan int64, 1)
		go func() { done <- c.Incr(ctx, key).Val() }()
		if requests {
			// Held before Redis: the value stays as the first round left it.
			time.Sleep(50 * time.Millisecond)
		} else {
			redistest.WaitFor(t, 5*time.Second, "the command run", func() (bool, error) {
				n, _ := direct.Get(ctx, key).Int64()
				return n == 1, nil
			})
		}
		if n, err := direct.Get(ctx, key).Int64(); err != nil || n != 1 {
			t.Fatalf("requests held %v: value %d (%v), want 1", requests, n, err)
		}
		select {
		case v := <-done:
			t.Fatalf("the reply (%d) came through the stall", v)
		default:
		}
		p.SetStall(false, false)
		select {
		case v := <-done:
			if want := map[bool]int64{false: 1, true: 2}[requests]; v != want {
				t.Fatalf("reply %d after the stall, want %d", v, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no reply after the stall ended")
		}
	}
}
