package redistest

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
)

// clockStepSource is the LD_PRELOAD library that moves a server's wall clock
// (testdata/clockstep.c says how, and why not libfaketime).
//
//go:embed testdata/clockstep.c
var clockStepSource []byte

// EnvClockFile names, for the library, the file whose first 8 bytes hold
// the clock's offset in nanoseconds.
const envClockFile = "REDSEM_CLOCK_FILE"

// WallClock moves the wall clock of one server started by StartWallClock,
// as an NTP step or a resumed virtual machine moves a host's clock: TIME,
// key expiry and the time scripts read jump by the step, while the server's
// monotonic clock (its timers) runs on undisturbed. The offset survives
// Restart. Only the server's clock moves: the test's own is the system's.
type WallClock struct {
	mu     sync.Mutex
	word   *int64 // the offset, in the file that the server's library maps
	mem    []byte
	offset time.Duration
}

// Step moves the server's wall clock by d (forward when d > 0): the next
// clock read of the server sees it.
func (c *WallClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
	atomic.StoreInt64(c.word, int64(c.offset))
}

// Offset is how far the server's wall clock is from the system's.
func (c *WallClock) Offset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.offset
}

// ErrNoClockStep says that no server with a movable clock can be started
// here: the library needs a C compiler (cc) to be built.
var ErrNoClockStep = errors.New("redistest: cannot move a server's wall clock: no C compiler (cc) to build " +
	"internal/testkit/redistest/testdata/clockstep.c (apt-get install gcc)")

// StartWallClock is Start for a server whose wall clock the test moves with
// the WallClock it returns. Without a C compiler the test is skipped, loudly,
// or fails under CI=true, where one is installed (.ci/run).
func StartWallClock(t testing.TB, extraArgs ...string) (*Server, *WallClock) {
	t.Helper()
	lib, err := clockStepLibrary()
	if err != nil {
		msg := fmt.Sprintf("!!! %v: the clock-step tests did NOT run", err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "wallclock")
	if err := os.WriteFile(file, make([]byte, 8), 0o600); err != nil {
		t.Fatal(err)
	}
	clock, err := mapClock(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(clock.unmap)
	s, err := startLocalEnv([]string{"LD_PRELOAD=" + lib, envClockFile + "=" + file}, extraArgs...)
	if err != nil {
		t.Fatalf("%s (%v)", HowToGetRedis, err)
	}
	t.Cleanup(s.Stop)
	if err := clock.check(s); err != nil {
		t.Fatal(err)
	}
	return s, clock
}

// check makes sure that the library moves s's clock: a server on which it
// did not load (the loader only warns) would run the test on the system's.
func (c *WallClock) check(s *Server) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := redis.NewClient(s.Options())
	defer rdb.Close()
	const probe = 1000 * time.Hour
	c.Step(probe)
	got, err := rdb.Time(ctx).Result()
	c.Step(-probe)
	if err != nil {
		return err
	}
	if ahead := time.Until(got); ahead < probe-time.Minute || ahead > probe+time.Minute {
		return fmt.Errorf("redistest: the server's clock did not move: %v ahead after a step of %v "+
			"(LD_PRELOAD of the clock-step library failed? see the server's log in its directory)", ahead, probe)
	}
	return nil
}

func mapClock(file string) (*WallClock, error) {
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, 8, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("redistest: map %s: %w", file, err)
	}
	return &WallClock{mem: mem, word: (*int64)(unsafe.Pointer(&mem[0]))}, nil
}

func (c *WallClock) unmap() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mem != nil {
		_ = syscall.Munmap(c.mem)
		c.mem, c.word = nil, nil
	}
}

var (
	clockLibOnce sync.Once
	clockLib     string
	clockLibErr  error
)

// clockStepLibrary builds the library once per machine and source (the
// file's name carries the source's hash) and returns its path.
func clockStepLibrary() (string, error) {
	clockLibOnce.Do(func() {
		sum := sha256.Sum256(clockStepSource)
		lib := filepath.Join(os.TempDir(), "redsem-clockstep-"+hex.EncodeToString(sum[:6])+".so")
		if _, err := os.Stat(lib); err == nil {
			clockLib = lib
			return
		}
		cc, err := exec.LookPath("cc")
		if err != nil {
			clockLibErr = ErrNoClockStep
			return
		}
		dir, err := os.MkdirTemp("", "redsem-clockstep-")
		if err != nil {
			clockLibErr = err
			return
		}
		defer os.RemoveAll(dir)
		src, out := filepath.Join(dir, "clockstep.c"), filepath.Join(dir, "clockstep.so")
		if err := os.WriteFile(src, clockStepSource, 0o600); err != nil {
			clockLibErr = err
			return
		}
		if msg, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", out, src).CombinedOutput(); err != nil {
			clockLibErr = fmt.Errorf("redistest: building the clock-step library: %v: %s", err, msg)
			return
		}
		// Another test binary may build it at the same time: each renames
		// its own complete file into place.
		if err := os.Rename(out, lib); err != nil {
			clockLibErr = err
			return
		}
		clockLib = lib
	})
	return clockLib, clockLibErr
}
