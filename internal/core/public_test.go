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
