package redisinfo_test

import (
	"math"
	"testing"

	"github.com/redsem/redsem/internal/redisinfo"
)

const infoText = "# Stats\r\ntotal_connections_received:3\r\ntotal_commands_processed:1234\r\n" +
	"# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.0\r\n" +
	"# Commandstats\r\ncmdstat_evalsha:calls=100,usec=5000,usec_per_call=50.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_eval:calls=2,usec=300,usec_per_call=150.00,rejected_calls=0,failed_calls=0\r\n" +
	"cmdstat_zadd:calls=400,usec=800,usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n"

func TestParseInfo(t *testing.T) {
	s := redisinfo.ParseInfo(infoText)
	if s.Commands != 1234 || s.ScriptCalls != 102 || s.ScriptUsec != 5300 {
		t.Errorf("got %+v, want commands 1234 and script calls 102", s)
	}
	near(t, "cpu", s.CPU, 3.75)
	d := s.Sub(redisinfo.ServerStats{Commands: 1000, ScriptCalls: 2, CPU: 0.75})
	if d.Commands != 234 || d.ScriptCalls != 100 {
		t.Errorf("diff %+v", d)
	}
	near(t, "cpu diff", d.CPU, 3)
}

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-9 {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}
