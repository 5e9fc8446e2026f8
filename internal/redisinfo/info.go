// Package redisinfo reads the server counters (INFO) and counts the commands a
// client sends: what the bench tool and the benchmarks report per operation.
package redisinfo

import (
	"context"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ServerStats are the counters of Redis INFO that the bench reads before and
// after a run.
type ServerStats struct {
	// Commands is INFO stats total_commands_processed. Redis 7 counts the
	// commands a script runs as well as the EVALSHA that ran it.
	Commands int64
	// ScriptCalls is the calls of evalsha + eval + fcall (+ the *_ro forms) from
	// INFO commandstats: the top-level script invocations.
	ScriptCalls int64
	// ScriptUsec is the usec of those calls: the time Redis spent running
	// scripts, unaffected by client scheduling and network.
	ScriptUsec int64
	// OtherUsec is the usec of every other command in commandstats: the
	// commands the scripts ran, plus the few the clients sent themselves
	// (SUBSCRIBE, PING, INFO).
	OtherUsec int64
	// CPU is used_cpu_sys + used_cpu_user in seconds (all server threads).
	CPU float64
}

// ParseInfo reads the text of INFO into ServerStats. Unknown or missing
// fields read as zero.
func ParseInfo(text string) ServerStats {
	var s ServerStats
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		switch k {
		case "total_commands_processed":
			s.Commands, _ = strconv.ParseInt(v, 10, 64)
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(v, 64)
			s.CPU += f
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro",
			"cmdstat_fcall", "cmdstat_fcall_ro":
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "calls="); ok {
					c, _ := strconv.ParseInt(n, 10, 64)
					s.ScriptCalls += c
				}
				if n, ok := strings.CutPrefix(f, "usec="); ok {
					c, _ := strconv.ParseInt(n, 10, 64)
					s.ScriptUsec += c
				}
			}
		default:
			if !strings.HasPrefix(k, "cmdstat_") {
				continue
			}
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "usec="); ok {
					c, _ := strconv.ParseInt(n, 10, 64)
					s.OtherUsec += c
				}
			}
		}
	}
	return s
}

// Sub returns the counters of s minus those of before.
func (s ServerStats) Sub(before ServerStats) ServerStats {
	return ServerStats{
		Commands:    s.Commands - before.Commands,
		ScriptCalls: s.ScriptCalls - before.ScriptCalls,
		ScriptUsec:  s.ScriptUsec - before.ScriptUsec,
		OtherUsec:   s.OtherUsec - before.OtherUsec,
		CPU:         s.CPU - before.CPU,
	}
}

// ReadStats runs INFO stats cpu commandstats on c.
func ReadStats(ctx context.Context, c redis.UniversalClient) (ServerStats, error) {
	text, err := c.Info(ctx, "stats", "cpu", "commandstats").Result()
	if err != nil {
		return ServerStats{}, err
	}
	return ParseInfo(text), nil
}
