package core

import (
	"errors"
	"testing"
)

// Only a refusal of FUNCTION itself keeps an engine on EVALSHA for good; a
// server that is out of memory, loading, busy or read-only is tried again.
func TestRefused(t *testing.T) {
	for msg, want := range map[string]bool{
		"ERR unknown command 'FUNCTION', with args beginning with: 'LOAD'":                       true,
		"ERR unknown command `function`, with args beginning with: `load`":                       true,
		"NOPERM User app has no permissions to run the 'function|load' command":                  true,
		"ERR unknown subcommand 'LOAD'. Try FUNCTION HELP.":                                      true,
		"OOM command not allowed when used memory > 'maxmemory'.":                                false,
		"LOADING Redis is loading the dataset in memory":                                         false,
		"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.": false,
		"READONLY You can't write against a read only replica.":                                  false,
		"dial tcp 127.0.0.1:1: connect: connection refused":                                      false,
	} {
		if got := refused(errors.New(msg)); got != want {
			t.Errorf("refused(%q) = %v, want %v", msg, got, want)
		}
	}
}
