package bench

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem/lua"
)

// ScriptCost is what one of redsem's scripts cost Redis during a run.
type ScriptCost struct {
	// Script is the script's file name without ".lua" ("acquire"), or
	// "eval" for calls that sent the whole text (an engine's first call).
	Script string `json:"script"`
	// CallsPerHold is its calls per hold made in the run.
	CallsPerHold float64 `json:"calls_per_hold"`
	// UsPerCall is the mean time Redis spent in one call (inner commands
	// included): SLOWLOG's split (from a short run of its own), scaled to
	// the measured run's INFO commandstats total.
	UsPerCall float64 `json:"us_per_call"`
}

// scriptLog times every top-level command of a run with SLOWLOG (threshold
// 0), so that the time Redis spent can be split by script: INFO
// commandstats adds every EVALSHA up into one line. It restores the
// server's slowlog settings when done. On a server that refuses CONFIG SET
// (ACL, managed services) it measures nothing.
type scriptLog struct {
	c               redis.UniversalClient
	threshold, size string
	on              bool
}

const scriptLogSize = 2000000

func startScriptLog(ctx context.Context, c redis.UniversalClient) *scriptLog {
	l := &scriptLog{c: c}
	cfg, err := c.ConfigGet(ctx, "slowlog-*").Result()
	if err != nil {
		return l
	}
	l.threshold, l.size = cfg["slowlog-log-slower-than"], cfg["slowlog-max-len"]
	if l.threshold == "" || l.size == "" {
		return l
	}
	if c.ConfigSet(ctx, "slowlog-max-len", "2000000").Err() != nil {
		return l
	}
	l.on = c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err() == nil &&
		c.Do(ctx, "slowlog", "reset").Err() == nil
	if !l.on {
		l.restore(ctx)
	}
	return l
}

func (l *scriptLog) restore(ctx context.Context) {
	if l.threshold != "" {
		_ = l.c.ConfigSet(ctx, "slowlog-log-slower-than", l.threshold).Err()
	}
	if l.size != "" {
		_ = l.c.ConfigSet(ctx, "slowlog-max-len", l.size).Err()
	}
}

// stop restores the settings and returns the cost of each script seen,
// per hold of holds, the most expensive per hold first (nil when the log
// could not be turned on or holds is 0).
func (l *scriptLog) stop(ctx context.Context, holds int) []ScriptCost {
	if !l.on {
		return nil
	}
	// Stop logging first so that reading the log is not logged.
	_ = l.c.ConfigSet(ctx, "slowlog-log-slower-than", "-1").Err()
	defer l.restore(ctx)
	logs, err := l.c.SlowLogGet(ctx, scriptLogSize).Result()
	_ = l.c.Do(ctx, "slowlog", "reset").Err()
	if err != nil || holds == 0 {
		return nil
	}
	return splitByScript(logs, holds)
}

// splitByScript groups SLOWLOG entries of script calls by script.
func splitByScript(logs []redis.SlowLog, holds int) []ScriptCost {
	names := map[string]string{}
	for _, s := range lua.Scripts() {
		names[s.Hash()] = strings.TrimSuffix(s.String(), ".lua")
		if f := s.Function(); f != "" {
			names[f] = strings.TrimSuffix(s.String(), ".lua")
		}
	}
	type acc struct {
		n   int
		dur time.Duration
	}
	per := map[string]*acc{}
	for _, e := range logs {
		if len(e.Args) < 2 {
			continue
		}
		var name string
		switch cmd := strings.ToLower(e.Args[0]); cmd {
		case "evalsha", "evalsha_ro":
			name = names[strings.ToLower(e.Args[1])]
		case "fcall", "fcall_ro":
			name = names[e.Args[1]]
		case "eval", "eval_ro":
			name = "eval"
		}
		if name == "" {
			continue
		}
		a := per[name]
		if a == nil {
			a = &acc{}
			per[name] = a
		}
		a.n++
		a.dur += e.Duration
	}
	var out []ScriptCost
	for name, a := range per {
		out = append(out, ScriptCost{Script: name, CallsPerHold: float64(a.n) / float64(holds),
			UsPerCall: float64(a.dur) / float64(time.Microsecond) / float64(a.n)})
	}
	sort.Slice(out, func(i, j int) bool {
		ci, cj := out[i].CallsPerHold*out[i].UsPerCall, out[j].CallsPerHold*out[j].UsPerCall
		if ci != cj {
			return ci > cj
		}
		return out[i].Script < out[j].Script
	})
	return out
}
