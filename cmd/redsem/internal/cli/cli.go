// Package cli holds what every redsem command-line tool shares: one flag
// set per subcommand with the flags every command takes (--redis, --prefix),
// one-line usage errors, the exit codes, the parsing of --redis into a
// go-redis client, and what commands that run until stopped need
// (InterruptContext, IsTerminal). Commands of cmd/redsem and the bench harness
// (cmd/redsem/internal/bench) are built on it, so that they behave alike.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
)

// Exit codes of every command.
const (
	ExitOK    = 0 // success
	ExitError = 1 // the command failed (Redis unreachable, a run failed, ...)
	ExitUsage = 2 // bad flags or arguments, or an invalid configuration
)

// DefaultRedis is used when neither --redis nor $REDIS_URL is given.
const DefaultRedis = "redis://127.0.0.1:6379"

// DefaultPrefix is the default of --prefix: the semaphores' default key
// prefix.
const DefaultPrefix = "redsem"

// OpTimeout bounds each Redis operation of a command.
const OpTimeout = 5 * time.Second

// Command is one subcommand's flag set, with the flags every command takes.
// Create it with New, add the command's own flags to FS, then call Parse.
type Command struct {
	Name   string        // the subcommand, as in "redsem NAME"
	FS     *flag.FlagSet // the command's flags; add its own before Parse
	Redis  string        // --redis: a URL or host:port seeds
	Prefix string        // --prefix: the semaphores' key prefix
	Stdout io.Writer
	Stderr io.Writer

	synopsis, about string
}

// redisUsage is the help of --redis.
const redisUsage = "Redis: a redis:// or rediss:// URL, or host:port[,host:port...] cluster seeds; the default is $REDIS_URL if set"

// New makes the flag set of a subcommand. synopsis is the usage line after
// "redsem NAME", about a sentence or two on what it does.
func New(name, synopsis, about string, stdout, stderr io.Writer) *Command {
	c := &Command{Name: name, FS: flag.NewFlagSet(name, flag.ContinueOnError), Stdout: stdout, Stderr: stderr}
	c.FS.SetOutput(io.Discard) // errors are reported in one line by Parse
	def := os.Getenv("REDIS_URL")
	if def == "" {
		def = DefaultRedis
	}
	c.FS.StringVar(&c.Redis, "redis", def, redisUsage)
	c.FS.StringVar(&c.Prefix, "prefix", DefaultPrefix, "key prefix of the semaphores")
	c.FS.Usage = func() {} // Parse prints the help for -h; errors take one line
	c.synopsis, c.about = synopsis, about
	return c
}

// Help prints the command's usage and flags on Stdout.
func (c *Command) Help() {
	fmt.Fprintf(c.Stdout, "Usage: redsem %s %s\n\n%s\n\nFlags:\n", c.Name, c.synopsis, c.about)
	c.FS.SetOutput(c.Stdout)
	c.FS.PrintDefaults()
	c.FS.SetOutput(io.Discard)
}

// Parse parses args, allowing flags before, between and after the
// positional arguments ("--" ends the flags), and checks that exactly
// nargs positional arguments were given (argNames names them in the error).
// It returns the positional arguments and, if the command should stop now
// (-h printed the help: ExitOK; a usage error was reported: ExitUsage),
// the exit code and stop == true.
func (c *Command) Parse(args []string, nargs int, argNames string) (pos []string, code int, stop bool) {
	return c.ParseBetween(args, nargs, nargs, argNames)
}

// ParseBetween is Parse for a command that takes from minArgs to maxArgs
// positional arguments.
func (c *Command) ParseBetween(args []string, minArgs, maxArgs int, argNames string) (pos []string, code int, stop bool) {
	var rest []string
	for i, a := range args {
		if a == "--" {
			rest = args[i+1:]
			args = args[:i]
			break
		}
	}
	// A negative number ("set-limit NAME -1") is an argument, not an
	// unknown flag: it is kept aside under a placeholder while the flags
	// are parsed (unless it is the value of the flag before it).
	const neg = "\x00neg:"
	args = append([]string(nil), args...)
	for i, a := range args {
		if isNegativeNumber(a) && !c.takesValue(args, i) {
			args[i] = neg + a
		}
	}
	defer func() {
		for i, p := range pos {
			pos[i] = strings.TrimPrefix(p, neg)
		}
	}()
	for {
		if err := c.FS.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.Help()
				return nil, ExitOK, true
			}
			return nil, c.UsageError("%v", err), true
		}
		args = c.FS.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	pos = append(pos, rest...)
	if len(pos) < minArgs {
		return nil, c.UsageError("missing arguments: want %s", argNames), true
	}
	if len(pos) > maxArgs {
		return nil, c.UsageError("too many arguments: want %s", argNames), true
	}
	return pos, 0, false
}

// isNegativeNumber reports whether a is a number below zero ("-1",
// "-0.5", "-1e3"): an argument, where "-1x" stays an unknown flag.
func isNegativeNumber(a string) bool {
	if len(a) < 2 || a[0] != '-' || !(a[1] >= '0' && a[1] <= '9' || a[1] == '.') {
		return false
	}
	_, err := strconv.ParseFloat(a, 64)
	return err == nil
}

// takesValue reports whether args[i] is the value of the flag before it
// ("--count -1"): that flag is defined, not boolean, and has no "=value".
func (c *Command) takesValue(args []string, i int) bool {
	if i == 0 {
		return false
	}
	prev := args[i-1]
	if len(prev) < 2 || prev[0] != '-' || strings.Contains(prev, "=") {
		return false
	}
	f := c.FS.Lookup(strings.TrimLeft(prev, "-"))
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// UsageError reports a usage error in one line on Stderr and returns
// ExitUsage.
func (c *Command) UsageError(format string, args ...any) int {
	fmt.Fprintf(c.Stderr, "redsem %s: %s (see 'redsem %s -h')\n", c.Name, OneLine(fmt.Sprintf(format, args...)), c.Name)
	return ExitUsage
}

// Fail reports err in one line on Stderr and returns ExitError, or
// ExitUsage when err is redsem.ErrInvalidConfig (invalid input).
func (c *Command) Fail(err error) int {
	fmt.Fprintf(c.Stderr, "redsem %s: %s\n", c.Name, OneLine(err.Error()))
	if errors.Is(err, redsem.ErrInvalidConfig) {
		return ExitUsage
	}
	return ExitError
}

// OwnServerByDefault is for commands that start a throw-away server of
// their own when no Redis is named (demo, bench): their help then shows no
// default address for --redis, and says what happens instead.
func (c *Command) OwnServerByDefault(instead string) {
	f := c.FS.Lookup("redis")
	f.DefValue = ""
	f.Usage = redisUsage + ", else " + instead
}

// RedisGiven reports whether the user chose a Redis, and how: "--redis"
// when the flag was set, "REDIS_URL" when only the environment names one.
// Call it after Parse. Commands that can run on a throw-away server of
// their own (demo, bench) start one only when it returns false.
func (c *Command) RedisGiven() (from string, given bool) {
	switch {
	case c.Given("redis"):
		from = "--redis"
	case os.Getenv("REDIS_URL") != "":
		from = "REDIS_URL"
	}
	return from, from != ""
}

// Given reports whether the flag name was set on the command line. Call it
// after Parse.
func (c *Command) Given(name string) (given bool) {
	c.FS.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// IsTerminal reports whether w is a terminal that understands escape
// sequences (so that a live view may redraw in place).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && !strings.EqualFold(os.Getenv("TERM"), "dumb")
}

// InterruptContext returns a context that ends on Ctrl-C (SIGINT) or
// SIGTERM, for a command that runs until it is stopped; stop releases it.
func InterruptContext() (ctx context.Context, stop context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// OneLine folds s onto one line: newlines become "; ", runs of white space
// one space.
func OneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// Target is a parsed --redis value: either URL (one server) or Cluster
// (seeds of a Redis Cluster) is set.
type Target struct {
	URL     *redis.Options
	Cluster *redis.ClusterOptions
	Display string // for messages: without the password
}

// ParseTarget parses a --redis value: a redis://, rediss:// or unix:// URL,
// or host:port[,host:port...]: one address is a single server, several are
// the seeds of a Redis Cluster. It does no I/O.
func ParseTarget(s string) (*Target, error) {
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
		return &Target{URL: opt, Display: display}, nil
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
		return &Target{URL: &redis.Options{Addr: addrs[0]}, Display: addrs[0]}, nil
	}
	return &Target{Cluster: &redis.ClusterOptions{Addrs: addrs}, Display: "cluster " + strings.Join(addrs, ",")}, nil
}

// Client returns a new client of the target with bounded timeouts and few
// retries (a person waits for the answer). The caller closes it.
func (t *Target) Client() redis.UniversalClient {
	return t.ClientWith(func(*redis.Options) {})
}

// ClientWith is Client with a last word on a single server's options
// (ignored for a cluster), e.g. a larger pool for a load generator.
func (t *Target) ClientWith(tune func(*redis.Options)) redis.UniversalClient {
	if t.Cluster != nil {
		o := *t.Cluster
		o.ContextTimeoutEnabled = true
		o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 3*time.Second, 3*time.Second, 3*time.Second
		o.MaxRetries, o.DialerRetries = 1, 2
		return redis.NewClusterClient(&o)
	}
	o := *t.URL
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
	if o.MaxRetries == 0 {
		o.MaxRetries = 1
	}
	if o.DialerRetries == 0 {
		o.DialerRetries = 2
	}
	tune(&o)
	return redis.NewClient(&o)
}

// OpContext returns a context for one Redis operation (OpTimeout).
func OpContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, OpTimeout)
}

// ReachErr explains a failure to talk to Redis at t.
func ReachErr(t *Target, err error) error {
	var op *net.OpError
	if errors.As(err, &op) {
		return fmt.Errorf("cannot reach Redis at %s: %w", t.Display, op)
	}
	return fmt.Errorf("redis at %s: %w", t.Display, err)
}

// QuietLogger drops go-redis's internal log lines (install it with
// redis.SetLogger): the commands report errors themselves, in one line.
type QuietLogger struct{}

// Printf discards the line.
func (QuietLogger) Printf(context.Context, string, ...any) {}
