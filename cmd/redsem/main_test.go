package main

import (
	"os"
	"testing"

	"github.com/redsem/redsem/internal/redistest"
)

// redistestMain lets the test binary stand in for the redsem executable:
// "bench --procs" re-executes os.Executable() with "bench --child ...",
// which for a test binary means running this TestMain with those args.
func redistestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "bench" {
		os.Exit(dispatch(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(redistest.Main(m))
}
