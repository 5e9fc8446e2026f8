package faults_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// A forced Sentinel failover (SENTINEL FAILOVER) while workers acquire and
// release through go-redis's failover client: no panic, errors only during
// the switch, tokens issued once the old primary is demoted above all
// tokens issued before, and the semaphore usable again. A forced failover can lose writes accepted by the old
// primary after the promotion, so holders beyond the limit are possible for
// a while (see docs/reliability.md); the test logs the peak.
func TestSentinelFailover(t *testing.T) {
	skipShort(t)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.CheckLeaks(t)
			primary := redistest.Start(t)
			replica := primary.StartReplica(t)
			sen := redistest.StartSentinel(t, primary, 1)
			fc := redis.NewFailoverClient(&redis.FailoverOptions{
				MasterName: redistest.SentinelMaster, SentinelAddrs: []string{sen.Addr},
				ContextTimeoutEnabled: true, DialTimeout: 2 * time.Second,
				ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second,
			})
			t.Cleanup(func() { _ = fc.Close() })
			sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr})
			t.Cleanup(func() { _ = sc.Close() })
			rc := replica.Client(t)
			pc := primary.Client(t)
			ctx := redistest.Ctx(t, 90*time.Second)
			s := v.new(t, fc, redistest.Name(t), 2, opts{LeaseTTL: 2 * time.Second, QueueTTL: time.Second, Fallback: 200 * time.Millisecond})
			runThroughFailover(t, ctx, s, 2, false, func() {
				// SENTINEL FAILOVER is one attempt: if the promotion is
				// not seen within failover-timeout (5 s, which a loaded
				// machine has reached), Sentinel aborts it and never tries
				// again by itself. Ask again (INPROG means it is still
				// trying); what is checked is that a failover happens.
				promoted := func() error {
					addr, err := sc.GetMasterAddrByName(ctx, redistest.SentinelMaster).Result()
					if err != nil || addr[0]+":"+addr[1] != replica.Addr {
						return errorf("master %v, %v", addr, err)
					}
					role, err := rc.Do(ctx, "ROLE").Slice()
					if err != nil || role[0] != "master" {
						return errorf("role %v, %v", role, err)
					}
					// Until the old primary is demoted, it still accepts
					// grants (to be lost) and issues tokens of its own.
					old, err := pc.Do(ctx, "ROLE").Slice()
					if err != nil || old[0] != "slave" {
						return errorf("old primary's role %v, %v", old, err)
					}
					return nil
				}
				var err error
				for attempt := 1; attempt <= 4; attempt++ {
					if ferr := sc.Failover(ctx, redistest.SentinelMaster).Err(); ferr != nil && !strings.HasPrefix(ferr.Error(), "INPROG") {
						if attempt == 1 || !strings.Contains(ferr.Error(), "NOGOODSLAVE") {
							t.Fatalf("SENTINEL FAILOVER: %v", ferr)
						}
					}
					if err = poll(15*time.Second, promoted); err == nil {
						return
					}
					t.Logf("failover attempt %d not done within 15 s (%v); sentinel log:\n%s", attempt, err, sen.LogTail(30))
				}
				t.Fatalf("replica not promoted after 4 attempts: %v", err)
			})
		})
	}
}
