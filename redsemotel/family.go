package redsemotel

import (
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/fair"
	"github.com/redsem/redsem/unfair"
	"go.opentelemetry.io/otel/attribute"
)

// Family is a keyed family (fair.Family, unfair.Family) whose members are
// instrumented as by Wrap, labelled by the family: made by WrapFamily.
// It is safe for concurrent use.
type Family struct {
	name    string
	get     func(key string) (redsem.Semaphore, error)
	close   func() error // nil: the family has none
	in      *instruments
	kv      []attribute.KeyValue // name, variant, WithAttributes (read only)
	keyAttr bool
	shared  *sets // the members' metric sets, without WithKeyAttribute
}

// WrapFamily returns family instrumented: the semaphores its Get returns
// are the family's members wrapped as by Wrap, with the family's name as
// redsem.semaphore.name and the member's key as redsem.semaphore.key on
// their spans only (on the metrics too with WithKeyAttribute), so that
// the metrics have one series per family, not per key. Every member shares
// one set of instruments and attribute sets: Get adds one small value to
// the family's own Get. WithStatusMetrics does not apply to families (see
// it).
//
//	fam, _ := fair.NewFamily(client, "tenants", 4, fair.FamilyOptions{})
//	tenants := redsemotel.WrapFamily(fam)
//	sem, err := tenants.Get(tenantID) // spans carry the key, metrics "tenants"
//
// family is anything with Name() string and Get(key string) (S, error):
// *fair.Family and *unfair.Family, and wrappers of your own.
func WrapFamily[S redsem.Semaphore](family interface {
	Name() string
	Get(key string) (S, error)
}, opts ...Option) *Family {
	c := newConfig(opts)
	c.statusMetrics = false // see WithStatusMetrics
	f := &Family{name: family.Name(), in: newInstruments(&c), keyAttr: c.keyAttr,
		get: func(key string) (redsem.Semaphore, error) {
			s, err := family.Get(key)
			if err != nil {
				return nil, err
			}
			return s, nil
		}}
	if cl, ok := family.(interface{ Close() error }); ok {
		f.close = cl.Close
	}
	f.kv = []attribute.KeyValue{AttrSemaphoreName.String(f.name)}
	var member S
	if v := familyVariant(family, member); v != "" {
		f.kv = append(f.kv, AttrSemaphoreVariant.String(v))
	}
	f.kv = append(f.kv, c.attrs...)
	if !f.keyAttr {
		f.shared = newSets(f.kv)
	}
	return f
}

// familyVariant is "fair" or "unfair" by the type of the family or of its
// members (S), "" for another.
func familyVariant(family, member any) string {
	switch family.(type) {
	case *fair.Family:
		return "fair"
	case *unfair.Family:
		return "unfair"
	}
	switch member.(type) {
	case *fair.Semaphore:
		return "fair"
	case *unfair.Semaphore:
		return "unfair"
	}
	return ""
}

// Get returns the family's member for key, instrumented; the family's Get
// error, unchanged, if it fails. The member's Name is key (the family's
// members are named by their keys); its Unwrap returns the family's own
// member.
func (f *Family) Get(key string) (redsem.Semaphore, error) {
	sem, err := f.get(key)
	if err != nil {
		return nil, err
	}
	kv := append(f.kv[:len(f.kv):len(f.kv)], AttrSemaphoreKey.String(key))
	m := f.shared
	if f.keyAttr {
		m = newSets(kv)
	}
	return &semaphore{sem: sem, in: f.in, span: kv, m: m}, nil
}

// Name is the family's name.
func (f *Family) Name() string { return f.name }

// Close is the family's Close (nil for a family without one).
func (f *Family) Close() error {
	if f.close == nil {
		return nil
	}
	return f.close()
}
