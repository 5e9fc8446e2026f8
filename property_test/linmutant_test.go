package property_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/anishathalye/porcupine"
	"github.com/redsem/redsem"
	"github.com/redsem/redsem/internal/testkit/redistest"
)

// The checker's self-test: semaphores with a deliberate bug, put in by a
// wrapper around the real one (the scripts are not touched), must yield
// histories that the checker rejects. So the checker cannot silently rot
// into accepting everything.

// mutation is a deliberate bug of a mutant semaphore.
type mutation int

const (
	// mutSlotClash reports, for a grant made while another lease (granted
	// through the mutant) is live, that lease's slot: two live leases on
	// one slot. Status reports the same false slot.
	mutSlotClash mutation = iota + 1
	// mutFalseRefusal releases every second grant at once and reports
	// ErrNoSlot: a refusal while a slot was free.
	mutFalseRefusal
	// mutLowToken reports, for every third grant, a token below every
	// token reported before it. Status reports the same false token.
	mutLowToken
)

func (m mutation) String() string {
	return map[mutation]string{mutSlotClash: "slot-clash", mutFalseRefusal: "false-refusal", mutLowToken: "low-token"}[m]
}

// mutantState is shared by the wrappers of every client of one history,
// as a bug in the scripts would be.
type mutantState struct {
	m      mutation
	mu     sync.Mutex
	grants int
	live   map[string]int // id -> reported slot, for leases not released
	slot   map[string]int // id -> false slot reported
	token  map[string]int64
	minTok int64 // lowest token reported so far
}

func newMutantState(m mutation) *mutantState {
	return &mutantState{m: m, live: map[string]int{}, slot: map[string]int{}, token: map[string]int64{}, minTok: math.MaxInt64}
}

// mutantSem wraps a semaphore and applies the mutation.
type mutantSem struct {
	redsem.Semaphore
	st *mutantState
}

type mutantLease struct {
	redsem.Lease
	st    *mutantState
	slot  int
	token int64
}

func (l *mutantLease) Slot() int    { return l.slot }
func (l *mutantLease) Token() int64 { return l.token }

func (l *mutantLease) Release(ctx context.Context) error {
	l.st.mu.Lock()
	delete(l.st.live, l.ID())
	l.st.mu.Unlock()
	return l.Lease.Release(ctx)
}

func (s *mutantSem) TryAcquire(ctx context.Context) (redsem.Lease, error) {
	l, err := s.Semaphore.TryAcquire(ctx)
	if err != nil {
		return l, err
	}
	st := s.st
	st.mu.Lock()
	st.grants++
	ml := &mutantLease{Lease: l, st: st, slot: l.Slot(), token: l.Token()}
	refuse := false
	switch st.m {
	case mutSlotClash:
		for _, other := range st.live {
			if other != ml.slot {
				ml.slot = other
				st.slot[l.ID()] = other
				break
			}
		}
	case mutFalseRefusal:
		refuse = st.grants%2 == 0
	case mutLowToken:
		if st.grants%3 == 0 && st.minTok != math.MaxInt64 {
			ml.token = st.minTok - 1
			st.token[l.ID()] = ml.token
		}
	}
	if !refuse {
		st.live[l.ID()] = ml.slot
		st.minTok = min(st.minTok, ml.token)
	}
	st.mu.Unlock()
	if refuse {
		if err := l.Release(ctx); err != nil {
			return nil, err
		}
		return nil, redsem.ErrNoSlot
	}
	return ml, nil
}

func (s *mutantSem) Status(ctx context.Context) (redsem.Status, error) {
	st, err := s.Semaphore.Status(ctx)
	if err != nil {
		return st, err
	}
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	for i, h := range st.Holders {
		if v, ok := s.st.slot[h.ID]; ok {
			st.Holders[i].Slot = v
		}
		if v, ok := s.st.token[h.ID]; ok {
			st.Holders[i].Token = v
		}
	}
	return st, nil
}

// TestLinearizabilityCheckerRejectsMutants feeds the checker histories of
// mutant semaphores and requires it to reject each.
func TestLinearizabilityCheckerRejectsMutants(t *testing.T) {
	srv := redistest.Start(t)
	// At most one lease per client and a fixed limit above the other
	// clients' leases: every false refusal happens with a slot free.
	w := linWorkload{clients: 4, ops: 60, limit: 4, maxHeld: 1}
	for _, m := range []mutation{mutSlotClash, mutFalseRefusal, mutLowToken} {
		t.Run(m.String(), func(t *testing.T) {
			for _, v := range linVariants {
				for _, f := range []*linFaults{nil, {drop: 0.04, kill: 0.02, retries: -1}} {
					st := newMutantState(m)
					wrap := func(s redsem.Semaphore) redsem.Semaphore { return &mutantSem{Semaphore: s, st: st} }
					h := recordHistory(t, srv, v.newSem, w, f, wrap)
					label := fmt.Sprintf("mutant-%s-%s", m, v.name)
					if f != nil {
						label += "-faults"
					}
					res, msg := checkHistory(t, label, h, false) // files only with $REDSEM_LIN_DIR
					if res != porcupine.Illegal {
						t.Errorf("%s: the checker accepted the history of a mutant (%v)", label, res)
						continue
					}
					t.Logf("rejected as it should be:\n%s", msg)
				}
			}
		})
	}
}
