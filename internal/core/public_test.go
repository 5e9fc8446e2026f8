package core_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/internal/core"
	"github.com/redsem/redsem/unfair"
)

// Every field of fair.Options and unfair.Options reaches the Config field
// that ConfigOf says, and that one alone.
func TestConfigOf(t *testing.T) {
	for _, c := range []struct {
		opts any
		fair bool
	}{{fair.Options{}, true}, {unfair.Options{}, false}} {
		ot := reflect.TypeOf(c.opts)
		for i := range ot.NumField() {
			field := ot.Field(i)
			opts := reflect.New(ot).Elem()
			opts.Field(i).Set(nonZero(t, field.Type))
			cfg := core.ConfigOf(nil, "n", 3, c.fair, opts.Interface())
			if cfg.Name != "n" || cfg.Limit != 3 || cfg.Fair != c.fair {
				t.Fatalf("%v: Name, Limit, Fair = %q, %d, %v", ot, cfg.Name, cfg.Limit, cfg.Fair)
			}
			var set []string
			cv := reflect.ValueOf(cfg)
			for j := range cv.NumField() {
				if name := cv.Type().Field(j).Name; !cv.Field(j).IsZero() && name != "Name" && name != "Limit" && name != "Fair" {
					set = append(set, name)
				}
			}
			if len(set) != 1 {
				t.Errorf("%v.%s alone set Config fields %v, want one", ot, field.Name, set)
			}
		}
	}
}

// nonZero is a value of type t that is not its zero value.
func nonZero(t *testing.T, typ reflect.Type) reflect.Value {
	v := reflect.New(typ).Elem()
	switch typ.Kind() {
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64:
		v.SetInt(7)
	case reflect.String:
		v.SetString("x")
	case reflect.Pointer:
		v.Set(reflect.New(typ.Elem()))
	case reflect.Func:
		v.Set(reflect.MakeFunc(typ, func([]reflect.Value) []reflect.Value { return nil }))
	case reflect.Struct:
		for i := range typ.NumField() {
			v.Field(i).Set(nonZero(t, typ.Field(i).Type))
		}
	default:
		t.Fatalf("no non-zero value for %v: extend nonZero", typ)
	}
	return v
}

// A *Handle embedded in fair.Semaphore and unfair.Semaphore promotes
// Engine's fields and Handle's methods to them: neither may add anything
// a user can reach, so their exported methods are redsem.Semaphore's and
// they have no exported field. EngineOf finds the engine behind them, and
// not behind a nil one.
func TestHandlePromotesNothing(t *testing.T) {
	for _, f := range reflect.VisibleFields(reflect.TypeFor[core.Engine]()) {
		if f.IsExported() {
			t.Errorf("core.Engine has an exported field %s: fair.Semaphore and unfair.Semaphore would promote it to users", f.Name)
		}
	}
	var want []string
	it := reflect.TypeFor[redsem.Semaphore]()
	for i := range it.NumMethod() {
		want = append(want, it.Method(i).Name)
	}
	for _, typ := range []reflect.Type{reflect.TypeFor[*fair.Semaphore](), reflect.TypeFor[*unfair.Semaphore]()} {
		var got []string
		for i := range typ.NumMethod() {
			got = append(got, typ.Method(i).Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%v has the exported methods %v, want redsem.Semaphore's %v", typ, got, want)
		}
		for _, f := range reflect.VisibleFields(typ.Elem()) {
			if f.IsExported() {
				t.Errorf("%v has an exported field %s", typ, f.Name)
			}
		}
	}
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // New does no I/O
	defer client.Close()
	f, err := fair.New(client, "f", 1, fair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := unfair.New(client, "u", 1, unfair.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []redsem.Semaphore{f, u} {
		if e := core.EngineOf(s); e == nil || e.Name() != s.Name() {
			t.Errorf("EngineOf(%T) = %v", s, e)
		}
	}
	if core.EngineOf((*fair.Semaphore)(nil)) != nil || core.EngineOf((*unfair.Semaphore)(nil)) != nil {
		t.Error("EngineOf of a nil *Semaphore is not nil")
	}
}
