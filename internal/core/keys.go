package core

import "strings"

// Keys are the Redis keys and channels of one semaphore. Every key and
// channel carries the same hash tag, {name} with braces escaped, so that a
// cluster keeps them in one slot and one script may touch them all.
type Keys struct {
	List []string // in the order lib.lua expects (KEYS[1..9])
	Chan string   // channel base; grants go to Chan+":s:"+session
	Free string   // channel of freed-slot notices for unfair waiters
}

// Key suffixes, in the order of lib.lua's KEYS.
var keySuffixes = [...]string{"holders", "leases", "queue", "waiters", "sessions", "bysess", "meta", "released", "limit"}

// Index of each key in Keys.List.
const (
	KeyHolders = iota
	KeyLeases
	KeyQueue
	KeyWaiters
	KeySessions
	KeyBySession
	KeyMeta
	KeyReleased
	KeyOverride
)

// KeysFor returns the keys of the semaphore name under prefix.
func KeysFor(prefix, name string) Keys {
	base := prefix + ":{" + EscapeTag(name) + "}:"
	k := Keys{List: make([]string, len(keySuffixes)), Chan: base + "ch"}
	for i, s := range keySuffixes {
		k.List[i] = base + s
	}
	k.Free = k.Chan + ":free"
	return k
}

var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// EscapeTag makes name safe inside a {hash-tag}: braces (and the escape
// character) are percent-encoded, so every name maps to a distinct,
// non-empty tag and all of a semaphore's keys hash to one slot.
func EscapeTag(name string) string { return tagEscaper.Replace(name) }
