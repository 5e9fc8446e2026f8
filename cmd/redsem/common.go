package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/core"
)

// defaultRedis is used when neither --redis nor REDIS_URL is given.
const defaultRedis = "redis://127.0.0.1:6379"

// opTimeout bounds each Redis operation of a command.
const opTimeout = 5 * time.Second

// command is one subcommand's flag set, with the flags every command takes.
type command struct {
	name     string
	synopsis string
	about    string
	fs       *flag.FlagSet
	redis    string
	prefix   string
	stdout   io.Writer
	stderr   io.Writer
}

// newCommand makes the flag set of a subcommand. synopsis is the usage line
// after "redsem NAME", about a sentence or two on what it does.
func newCommand(name, synopsis, about string, stdout, stderr io.Writer) *command {
	c := &command{name: name, fs: flag.NewFlagSet(name, flag.ContinueOnError), stdout: stdout, stderr: stderr}
	c.fs.SetOutput(io.Discard) // errors are reported in one line by parse
	def := os.Getenv("REDIS_URL")
	if def == "" {
		def = defaultRedis
	}
	c.fs.StringVar(&c.redis, "redis", def, "Redis: a redis:// or rediss:// URL, or host:port[,host:port...] cluster seeds; the default is $REDIS_URL if set")
	c.fs.StringVar(&c.prefix, "prefix", core.DefaultPrefix, "key prefix of the semaphores")
	c.fs.Usage = func() {} // parse prints the help for -h; errors take one line
	c.synopsis, c.about = synopsis, about
	return c
}

// help prints the command's usage and flags on stdout.
func (c *command) help() {
	fmt.Fprintf(c.stdout, "Usage: redsem %s %s\n\n%s\n\nFlags:\n", c.name, c.synopsis, c.about)
	c.fs.SetOutput(c.stdout)
	c.fs.PrintDefaults()
	c.fs.SetOutput(io.Discard)
}

// parse parses args, allowing flags before, between and after the
// positional arguments ("--" ends the flags), and checks that exactly
// nargs positional arguments were given. It returns the positional
// arguments and, if parsing should stop, the exit code.
func (c *command) parse(args []string, nargs int, argNames string) ([]string, int, bool) {
	var pos, rest []string
	for i, a := range args {
		if a == "--" {
			rest = args[i+1:]
			args = args[:i]
			break
		}
	}
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.help()
				return nil, exitOK, true
			}
			return nil, c.usageError("%v", err), true
		}
		args = c.fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	pos = append(pos, rest...)
	if len(pos) != nargs {
		if len(pos) < nargs {
			return nil, c.usageError("missing arguments: want %s", argNames), true
		}
		return nil, c.usageError("too many arguments: want %s", argNames), true
	}
	return pos, 0, false
}

// usageError reports a usage error in one line and returns exitUsage.
func (c *command) usageError(format string, args ...any) int {
	fmt.Fprintf(c.stderr, "redsem %s: %s (see 'redsem %s -h')\n", c.name, oneLine(fmt.Sprintf(format, args...)), c.name)
	return exitUsage
}

// fail reports err in one line and returns exitError, or exitUsage for
// invalid input.
func (c *command) fail(err error) int {
	fmt.Fprintf(c.stderr, "redsem %s: %s\n", c.name, oneLine(err.Error()))
	if errors.Is(err, redsem.ErrInvalidConfig) {
		return exitUsage
	}
	return exitError
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// target is a parsed --redis value.
type target struct {
	url     *redis.Options
	cluster *redis.ClusterOptions
	display string // without the password
}

// parseTarget parses a --redis value: a redis://, rediss:// or unix:// URL,
// or host:port[,host:port...]: one address is a single server, several are
// the seeds of a Redis Cluster.
func parseTarget(s string) (*target, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("empty --redis")
	}
	if strings.Contains(s, "://") {
		opt, err := redis.ParseURL(s)
		if err != nil {
			return nil, fmt.Errorf("bad --redis URL: %w", err)
		}
		display := s
		if u, err := url.Parse(s); err == nil {
			display = u.Redacted()
		}
		return &target{url: opt, display: display}, nil
	}
	var addrs []string
	for _, a := range strings.Split(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("bad --redis address %q: want a redis:// or rediss:// URL, or host:port[,host:port...]", a)
		}
		addrs = append(addrs, a)
	}
	switch len(addrs) {
	case 0:
		return nil, errors.New("empty --redis")
	case 1:
		return &target{url: &redis.Options{Addr: addrs[0]}, display: addrs[0]}, nil
	}
	return &target{cluster: &redis.ClusterOptions{Addrs: addrs}, display: "cluster " + strings.Join(addrs, ",")}, nil
}

// client returns a new client of the target, with bounded timeouts.
func (t *target) client() redis.UniversalClient {
	if t.cluster != nil {
		o := *t.cluster
		o.ContextTimeoutEnabled = true
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 3*time.Second, 3*time.Second, 3*time.Second
		o.MaxRetries, o.DialerRetries = 1, 2
		return redis.NewClusterClient(&o)
	}
	o := *t.url
	o.ContextTimeoutEnabled = true
	if o.DialTimeout == 0 {
		o.DialTimeout = 3 * time.Second
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = 3 * time.Second
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = 3 * time.Second
	}
	// A person waits for the answer: fail fast rather than retry for long.
	if o.MaxRetries == 0 {
		o.MaxRetries = 1
	}
	if o.DialerRetries == 0 {
		o.DialerRetries = 2
	}
	return redis.NewClient(&o)
}

// open connects to --redis and returns the engine used to read and change
// semaphore name's state. Its limit (1) is only the fallback the scripts use
// when no limit is established. On a bad --redis or name it reports the
// error and returns stop with the exit code; otherwise the caller closes
// client.
func (c *command) open(name string) (client redis.UniversalClient, t *target, e *core.Engine, code int, stop bool) {
	t, err := parseTarget(c.redis)
	if err != nil {
		return nil, nil, nil, c.usageError("%v", err), true
	}
	client = t.client()
	e, err = core.New(core.Config{Client: client, Name: name, Limit: 1, Prefix: c.prefix})
	if err != nil {
		_ = client.Close()
		return nil, nil, nil, c.fail(err), true
	}
	return client, t, e, 0, false
}

// opContext returns a context for one Redis operation.
func opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, opTimeout)
}

// reachErr explains a failure to talk to Redis.
func reachErr(t *target, err error) error {
	var op *net.OpError
	if errors.As(err, &op) {
		return fmt.Errorf("cannot reach Redis at %s: %w", t.display, op)
	}
	return fmt.Errorf("redis at %s: %w", t.display, err)
}

// quietLogger drops go-redis's internal log lines: the command reports
// errors itself, in one line.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
