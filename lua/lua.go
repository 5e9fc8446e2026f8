// Package lua holds redsem's Redis scripts. Each script is a .lua file in
// this directory whose header states its KEYS, ARGV and reply; the lib, the
// lib_*.lua files concatenated in the order of libFiles, holds the functions
// the semaphore scripts share and is prepended to each one (fence_lib.lua to
// the fencing scripts). All scripts take time from the
// Redis server (TIME), never from the client, and touch only the keys of one
// semaphore, which share a {hash-tag} so that Redis Cluster keeps them in one
// slot.
//
// Nothing here can be changed from outside: a Script is a constant naming
// one script, and offers its exact text and SHA1 for review, for ACL rules or
// for loading the scripts ahead of time (SCRIPT LOAD). The library calls the
// scripts itself; their arguments are an internal protocol that may change
// between releases, so calling them from other code is not supported.
package lua

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strings"
)

var (
	//go:embed lib_args.lua
	libArgs string
	//go:embed lib_records.lua
	libRecords string
	//go:embed lib_family.lua
	libFamily string
	//go:embed lib_total.lua
	libTotal string
	//go:embed lib_slots.lua
	libSlots string
	//go:embed lib_prune.lua
	libPrune string
	//go:embed lib_limit.lua
	libLimit string
	//go:embed lib_rate.lua
	libRate string
	//go:embed lib_queue.lua
	libQueue string
	//go:embed lib_admit.lua
	libAdmit string
	//go:embed lib_release.lua
	libRelease string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed renewmany.lua
	renewManySrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed releasemany.lua
	releaseManySrc string
	//go:embed heartbeat.lua
	heartbeatSrc string
	//go:embed status.lua
	statusSrc string
	//go:embed setlimit.lua
	setLimitSrc string
	//go:embed setrate.lua
	setRateSrc string
	//go:embed settotal.lua
	setTotalSrc string
	//go:embed famstatus.lua
	famStatusSrc string
	//go:embed fence_lib.lua
	fenceLib string
	//go:embed fence.lua
	fenceSrc string
	//go:embed fence_set.lua
	fenceSetSrc string
)

// libFiles are the files of the lib, by concern, in the order in which they
// are concatenated: each uses only what the files before it define (Lua
// sees a local only below its declaration), as its header states.
var libFiles = []string{libArgs, libRecords, libFamily, libSlots, libPrune, libLimit, libRate, libQueue, libAdmit, libTotal, libRelease}

// lib is the text of the lib: its files, concatenated.
var lib = strings.Join(libFiles, "")

// Script names one of redsem's scripts.
type Script uint8

const (
	// Acquire takes n slots, or (queue mode) joins the fair queue.
	Acquire Script = iota + 1
	// Renew extends a live lease and never re-creates a lost one.
	Renew
	// Release gives a slot back or removes a queue entry, then admits waiters.
	Release
	// Heartbeat keeps a process's fair waiters alive, at a cost that does
	// not grow with their number.
	Heartbeat
	// Status reads the live state without writing (it runs as FCALL_RO or
	// EVALSHA_RO).
	Status
	// SetLimit sets the limit for every client of a name.
	SetLimit
	// Fence checks a fencing token for the slots of a resource and records
	// it (package fencing). It runs in the store-side Redis, on a fence key
	// rather than the semaphore keys.
	Fence
	// FenceSet is Fence plus a SET of one data key, only when not stale.
	FenceSet
	// SetRate sets the rate (Options.Rate) for every client of a name.
	SetRate
	// SetTotal sets the total of a keyed family (FamilyOptions.Total) for
	// every client; it runs on the family's keys, not a member's.
	SetTotal
	// FamilyStatus reads a keyed family's total and its use without
	// writing (FCALL_RO or EVALSHA_RO), on the family's keys.
	FamilyStatus
	// RenewMany is Renew for many leases of one semaphore in one call: a
	// process's watchdog renews all its leases that are due together.
	RenewMany
	// ReleaseMany is Release (a holder's) for many leases of one semaphore
	// in one call: the releases a process asks for while one of its
	// release calls is in flight go together in its next.
	ReleaseMany

	lastScript = ReleaseMany
)

// Count is one more than the largest Script: an array indexed by Script
// has Count elements.
const Count = int(lastScript) + 1

// Scripts lists every script, in the order of their constants.
func Scripts() []Script {
	return []Script{Acquire, Renew, Release, Heartbeat, Status, SetLimit, Fence, FenceSet, SetRate, SetTotal, FamilyStatus, RenewMany, ReleaseMany}
}

type script struct {
	file, src, sha string
}

// The semaphore scripts: each is the lib followed by the script's file,
// sent whole with EVAL (or by SHA1 with EVALSHA), or one function of the
// FUNCTION library (Library). Every script starts with bind(KEYS, ARGV),
// which sets the lib's per-call state (lib_args.lua); KEYS and ARGV are
// Redis's globals in the EVAL form, and the function's parameters of the
// same names in the library.
var bodies = []struct {
	s         Script
	file, src string
	fn        string // the function's name in the library, after the prefix
	readOnly  bool   // registered with the no-writes flag (FCALL_RO)
	family    bool   // runs on a family's four keys (bindFamily), not a member's
}{
	{Acquire, "acquire.lua", acquireSrc, "acquire", false, false},
	{Renew, "renew.lua", renewSrc, "renew", false, false},
	{RenewMany, "renewmany.lua", renewManySrc, "renewmany", false, false},
	{Release, "release.lua", releaseSrc, "release", false, false},
	{ReleaseMany, "releasemany.lua", releaseManySrc, "releasemany", false, false},
	{Heartbeat, "heartbeat.lua", heartbeatSrc, "heartbeat", false, false},
	{Status, "status.lua", statusSrc, "status", true, false},
	{SetLimit, "setlimit.lua", setLimitSrc, "setlimit", false, false},
	{SetRate, "setrate.lua", setRateSrc, "setrate", false, false},
	{SetTotal, "settotal.lua", setTotalSrc, "settotal", false, true},
	{FamilyStatus, "famstatus.lua", famStatusSrc, "famstatus", true, true},
}

const (
	bindCall       = "local bind_err = bind(KEYS, ARGV) if bind_err then return bind_err end\n"
	bindFamilyCall = "local bind_err = bind(KEYS, ARGV, true) if bind_err then return bind_err end\n"
)

// bindOf is the first statement of a script's body.
func bindOf(family bool) string {
	if family {
		return bindFamilyCall
	}
	return bindCall
}

// library is the FUNCTION library: its name (redsem_ and the first 12 hex
// digits of the SHA1 of its text without the name line, so that each
// version of the scripts is a library of its own and two versions of
// redsem can share a server) and its text.
var libName, libSrc = func() (string, string) {
	var b strings.Builder
	b.WriteString(lib)
	for _, x := range bodies {
		fmt.Fprintf(&b, "\nlocal function fn_%s(KEYS, ARGV)\n%s%s\nend\n", x.fn, bindOf(x.family), x.src)
	}
	body := b.String()
	sum := sha1.Sum([]byte(body))
	name := "redsem_" + hex.EncodeToString(sum[:])[:12]
	var reg strings.Builder
	for _, x := range bodies {
		flags := ""
		if x.readOnly {
			flags = ", flags={'no-writes'}"
		}
		fmt.Fprintf(&reg, "redis.register_function{function_name='%s_%s', callback=fn_%s%s}\n", name, x.fn, x.fn, flags)
	}
	return name, "#!lua name=" + name + "\n" + body + "\n" + reg.String()
}()

// Library returns the name and the text of the FUNCTION library that holds
// the semaphore scripts (every Script but Fence and FenceSet), for FUNCTION
// LOAD. The name changes with the text.
func Library() (name, src string) { return libName, libSrc }

// Function returns the name of the script's function in Library, for
// FCALL (FCALL_RO for Status); "" for the fencing scripts, which run with
// EVALSHA only.
func (s Script) Function() string {
	for _, x := range bodies {
		if x.s == s {
			return libName + "_" + x.fn
		}
	}
	return ""
}

var table = func() [lastScript + 1]script {
	var t [lastScript + 1]script
	add := func(s Script, file, src string) {
		sum := sha1.Sum([]byte(src))
		t[s] = script{file: file, src: src, sha: hex.EncodeToString(sum[:])}
	}
	for _, b := range bodies {
		add(b.s, b.file, lib+bindOf(b.family)+b.src)
	}
	add(Fence, "fence.lua", fenceLib+fenceSrc)
	add(FenceSet, "fence_set.lua", fenceLib+fenceSetSrc)
	return t
}()

// String returns the name of the script's file, e.g. "acquire.lua".
func (s Script) String() string {
	if e := s.entry(); e.file != "" {
		return e.file
	}
	return fmt.Sprintf("Script(%d)", uint8(s))
}

// Source returns the exact text sent to Redis by EVAL: the shared library
// followed by the script's file ("" for a value that names no script).
func (s Script) Source() string { return s.entry().src }

// Hash returns the SHA1 of Source, in hex, as EVALSHA and SCRIPT EXISTS
// name the script ("" for a value that names no script).
func (s Script) Hash() string { return s.entry().sha }

func (s Script) entry() script {
	if s < Acquire || s > lastScript {
		return script{}
	}
	return table[s]
}
