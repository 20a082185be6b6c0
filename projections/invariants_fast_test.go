package projections

import (
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
)

// The fast path of CheckInvariants says "hold" exactly when the full check
// finds nothing, on folded states and on states broken each way a rule
// names.
func TestInvariantsFastPathAgrees(t *testing.T) {
	mix, err := eventgen.Mix(600, 20)
	if err != nil {
		t.Fatal(err)
	}
	s := New()
	breaks := []func(*State){
		func(s *State) { s.Endpoints["x:1"] = 999 },
		func(s *State) {
			for _, w := range s.Workers {
				w.Term = s.Term + 1
				return
			}
		},
		func(s *State) {
			for _, w := range s.Workers {
				w.ID++
				return
			}
		},
		func(s *State) { s.NextWorkerID = 1 },
		func(s *State) {
			s.Stores["dup"] = &Store{ID: "dup", RaftAddr: "10.0.1.0:63000", State: events.StoreUp}
		},
		func(s *State) {
			for _, sh := range s.Shards {
				sh.Members[99] = "no-such-store"
				return
			}
		},
		func(s *State) {
			for _, sh := range s.Shards {
				for r, st := range sh.Members {
					sh.Removed = map[uint64]string{r: st}
					return
				}
			}
		},
		func(s *State) {
			for _, sh := range s.Shards {
				for _, st := range sh.Members {
					sh.Members[98] = st
					return
				}
			}
		},
		func(s *State) {
			for _, sh := range s.Shards {
				sh.Leader = 77
				return
			}
		},
		func(s *State) {
			for _, sh := range s.Shards {
				sh.Operator = "ghost"
				return
			}
		},
		func(s *State) { s.Operators["ghost"] = &Operator{ID: "ghost", Shard: 1} },
	}
	for i, ev := range mix.Events {
		ev.Seq = uint64(i + 1)
		s.Apply(ev)
		if i%50 != 49 {
			continue
		}
		if fast, slow := s.invariantsHold(), s.violations(); fast != (slow == nil) {
			t.Fatalf("seq %d: fast path %v, full check %v", ev.Seq, fast, slow)
		}
		for j, brk := range breaks {
			c := s.Clone()
			brk(c)
			if fast, slow := c.invariantsHold(), c.violations(); fast != (slow == nil) {
				t.Fatalf("seq %d, break %d: fast path %v, full check %v", ev.Seq, j, fast, slow)
			}
		}
	}
}
