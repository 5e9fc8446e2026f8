package wire

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
)

// replyErr is a Redis error reply as go-redis hands it over (a type with a
// RedisError method), for texts that no test server here can be made to
// answer.
type replyErr string

func (e replyErr) Error() string { return string(e) }
func (replyErr) RedisError()     {}

// The classifier over error texts: a refusal is named by the reply's code
// (NOPERM), or, under ERR (or a reply without a code), by an unknown
// command or a disabled one; a reply whose code is a server state (MISCONF,
// OOM, LOADING, BUSY, READONLY, ...) is tried again, whatever words its
// message contains, and so is anything that is not a reply of the server.
func TestRefused(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{"ERR unknown command 'FUNCTION', with args beginning with: 'LOAD'", true},
		{"ERR unknown command `function`, with args beginning with: `load`", true},
		{"NOPERM User app has no permissions to run the 'function|load' command", true},
		{"NOPERM this user has no permissions to run the 'function' command or its subcommand", true},
		{"ERR unknown subcommand 'LOAD'. Try FUNCTION HELP.", true},
		{"ERR command 'FUNCTION' is disabled", true},
		{"ERR command not allowed on this service", true},
		{"ERR NOPERM this user has no permissions to run the 'function' command", true}, // a proxy's ERR before the code
		{"unsupported command 'function'", true},                                        // a proxy's reply without a code
		{"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk. " +
			"Commands that may modify the data set are disabled, because this instance is configured to report errors " +
			"during writes if RDB snapshotting fails (stop-writes-on-bgsave-error option). Please check the Redis logs " +
			"for details about the RDB error.", false},
		{"MISCONF Errors writing to the AOF file: No space left on device", false},
		{"ERR MISCONF Commands that may modify the data set are disabled", false}, // a proxy's ERR before the code
		// A capital word after ERR is read as a code, so this is tried
		// again: the harmless mistake (a refusal is for the client's life).
		{"ERR FUNCTION is disabled", false},
		{"OOM command not allowed when used memory > 'maxmemory'.", false},
		{"LOADING Redis is loading the dataset in memory", false},
		{"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", false},
		{"READONLY You can't write against a read only replica.", false},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", false},
		{"CLUSTERDOWN The cluster is down", false},
		{"TRYAGAIN Multiple keys request during rehashing of slot", false},
		{"NOREPLICAS Not enough good replicas to write.", false},
		{"ERR max number of clients reached", false},
		{"NOAUTH Authentication required.", false},
	} {
		if got := Refused(replyErr(c.msg)); got != c.want {
			t.Errorf("Refused(reply %q) = %v, want %v", c.msg, got, c.want)
		}
	}
	// Not replies of the server: never a refusal, whatever the words.
	for _, err := range []error{
		errors.New("dial tcp 127.0.0.1:1: connect: connection refused"),
		errors.New("ERR unknown command 'FUNCTION'"), // a text, not a reply
		context.DeadlineExceeded,
		redis.ErrClosed,
	} {
		if Refused(err) {
			t.Errorf("Refused(%v) = true for an error that is not a Redis reply", err)
		}
	}
}
