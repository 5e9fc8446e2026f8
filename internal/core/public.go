package core

import (
	"reflect"

	"github.com/redsem/redsem"
)

// What the public packages fair and unfair are made of. Each declares its
// own Options, Semaphore and Family, each with its variant's documentation
// (go doc shows no method promoted from a type of another package), and
// no logic: a Semaphore is a *Handle, each of its methods one line that
// calls the engine, and its Options become a Config through their method
// config. Both packages' files of these are generated from one template
// each (internal/variantgen).

// Handle is the engine as fair.Semaphore and unfair.Semaphore hold it.
// Each embeds a *Handle under an unexported alias (type handle =
// core.Handle), which promotes to it Handle's one method, engine. That
// method is unexported, so only this package can call it (EngineOf does,
// through holder): no type outside this package can declare it, and no
// user can reach the engine through a Semaphore. A Handle has no other
// method, so nothing else of the engine becomes part of the public types;
// their own methods convert the *Handle to the *Engine, which costs
// nothing. Engine's fields are promoted too, which is why Engine may have
// no exported field (TestHandlePromotesNothing).
type Handle Engine

func (h *Handle) engine() *Engine { return (*Engine)(h) }

// holder is what fair.Semaphore and unfair.Semaphore are, by the *Handle
// they embed, and no type of another module can be.
type holder interface{ engine() *Engine }

// EngineOf returns the engine behind a semaphore built by this module's
// fair or unfair package (found by holder), also
// through wrappers that have a method Unwrap() redsem.Semaphore
// (redsemotel's), or nil for any other implementation and for a nil
// *Semaphore.
func EngineOf(sem redsem.Semaphore) *Engine {
	for depth := 0; sem != nil && depth < 16; depth++ {
		if h, ok := sem.(holder); ok {
			if v := reflect.ValueOf(sem); v.Kind() == reflect.Pointer && v.IsNil() {
				return nil
			}
			return h.engine()
		}
		u, ok := sem.(interface{ Unwrap() redsem.Semaphore })
		if !ok {
			return nil
		}
		sem = u.Unwrap()
	}
	return nil
}
