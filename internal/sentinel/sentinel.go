// Package sentinel makes the library's sentinel errors and knows them all:
// the root package's (ErrNoSlot, ErrUnavailable, ...) and the engine's own
// (a cancelled acquire, a dead session, a lease being released). An error
// that matches one of them is the library's, never the client's (Own), so
// the engine's classification adds nothing to it; the list is the one the
// declarations make, not a copy kept in line by hand.
//
// It imports nothing of redsem (the root package uses it).
package sentinel

import "errors"

// all are the errors New made, in the order their packages were
// initialized; written only during package initialization.
var all []error

// New returns an error with text (errors.New), and records it as one of the
// library's own. Call it only to initialize a package-level variable.
func New(text string) error {
	err := errors.New(text)
	all = append(all, err)
	return err
}

// Register records err, a sentinel of another type (one with an Error
// method of its own), as one of the library's own and returns it. Call it
// only to initialize a package-level variable.
func Register(err error) error {
	all = append(all, err)
	return err
}

// Own reports whether err matches (errors.Is) one of the library's
// sentinels.
func Own(err error) bool {
	for _, s := range all {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}
