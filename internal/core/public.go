package core

import (
	"fmt"
	"reflect"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
)

// What the public packages fair and unfair are made of. Each declares its
// own Options, Semaphore and Family, each with its variant's documentation
// (go doc shows no method promoted from a type of another package), and
// no logic: a Semaphore is a *Handle, each of its methods one line that
// calls the engine, and its Options become a Config through ConfigOf.

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

// optionNames gives, for a field of fair.Options or unfair.Options whose
// name is not Config's, the name of Config's field.
var optionNames = map[string]string{"KeyPrefix": "Prefix", "FallbackInterval": "Fallback"}

// ConfigOf is the Config that fair.New and unfair.New (and their
// NewFamily) build an engine from: client, name, limit and fair as given,
// and every field of opts, a fair.Options or unfair.Options, copied into
// the Config field of the same name and type (KeyPrefix into Prefix,
// FallbackInterval into Fallback). So an option is declared in the public
// Options and in Config, and not listed a third time to copy it; the two
// Options keep their own fields and docs (a field of a struct embedded in
// them could not be named in a composite literal), which
// options_doc_test.go holds in line. An options field that Config lacks is
// a bug of this module, not a configuration error: ConfigOf panics naming
// it, in every test that builds a semaphore (and TestConfigOf).
func ConfigOf(client redis.UniversalClient, name string, limit int, fair bool, opts any) Config {
	cfg := Config{Client: client, Name: name, Limit: limit, Fair: fair}
	src := reflect.ValueOf(opts)
	dst := reflect.ValueOf(&cfg).Elem()
	for i := range src.NumField() {
		field := src.Type().Field(i)
		to := field.Name
		if n, ok := optionNames[to]; ok {
			to = n
		}
		d := dst.FieldByName(to)
		if !d.IsValid() || d.Type() != field.Type {
			panic(fmt.Sprintf("core.ConfigOf: %s.%s (%v) has no Config field %s of that type", src.Type(), field.Name, field.Type, to))
		}
		d.Set(src.Field(i))
	}
	return cfg
}
