package history

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// simulate runs a correct registry (the real rules: ids from a counter,
// one active id per endpoint, expiry after the timeout, seq per event) and
// records n operations, each around its linearization point with a random
// invoke and return delay, so operations of different clients overlap.
func simulate(seed uint64, n int) []Op {
	rng := rand.New(rand.NewPCG(seed, seed))
	type w struct {
		ep, inc     string
		id, epoch   uint64
		life        time.Duration
		alive, live bool
	}
	var (
		seq, next uint64 = 0, 1
		regs             = map[uint64]*w{}
		incs             = map[string]string{} // endpoint -> its current incarnation
		now       time.Duration
		ops       []Op
	)
	at := func(ep string) *w {
		for _, r := range regs {
			if r.alive && r.ep == ep {
				return r
			}
		}
		return nil
	}
	rec := func(cl string, in Input, out Output) {
		call := now - time.Duration(rng.IntN(40))*time.Millisecond
		ops = append(ops, Op{Client: cl, Input: in, Output: out, Call: max(call, 0), Return: now + time.Duration(rng.IntN(40))*time.Millisecond, Done: true})
	}
	for len(ops) < n {
		now += time.Duration(1+rng.IntN(60)) * time.Millisecond
		for _, r := range regs { // expiry by the leader
			if r.alive && now-r.life > timeout+100*time.Millisecond {
				r.alive = false
				seq++
			}
		}
		ep := fmt.Sprintf("h:%d", 1+rng.IntN(4))
		cl := "w-" + ep
		switch k := rng.IntN(20); {
		case k < 2: // a (re)start: a new incarnation registers
			incs[ep] = fmt.Sprintf("%s#%d", ep, len(ops))
			fallthrough
		case k < 4:
			inc := incs[ep]
			if inc == "" {
				continue
			}
			r := at(ep)
			if r == nil || r.inc != inc {
				if r != nil {
					r.alive = false
				}
				seq++
				r = &w{ep: ep, inc: inc, id: next, epoch: seq, alive: true}
				next++
				regs[r.id] = r
			}
			r.life = now
			rec(cl, Input{Kind: Register, Endpoint: ep, Incarnation: inc}, Output{Outcome: OK, ID: r.id, Epoch: r.epoch})
		case k < 14:
			r := at(ep)
			if r == nil {
				continue
			}
			if rng.IntN(8) == 0 {
				continue // this one stops heartbeating for a while
			}
			out := Output{Outcome: OK}
			if now-r.life > timeout {
				out.Outcome = Reregister
			} else {
				r.life = now
			}
			rec(cl, Input{Kind: Heartbeat, ID: r.id, Epoch: r.epoch}, out)
		case k < 15:
			r := at(ep)
			if r == nil {
				continue
			}
			r.alive = false
			seq++
			rec(cl, Input{Kind: Deregister, ID: r.id, Epoch: r.epoch}, Output{Outcome: OK})
		default:
			out := Output{Outcome: OK, Seq: seq}
			for id := uint64(1); id < next; id++ {
				if r := regs[id]; r.alive {
					out.Workers = append(out.Workers, Worker{ID: r.id, Epoch: r.epoch, Incarnation: r.inc, Endpoint: r.ep})
				}
			}
			rec(fmt.Sprintf("reader-%d", rng.IntN(2)), Input{Kind: Read}, out)
		}
	}
	return ops
}

func TestSimulatedHistories(t *testing.T) {
	for seed := range uint64(3) {
		ops := simulate(seed, 1500)
		start := time.Now()
		res, err := Check(ops, Options{WorkerTimeout: timeout, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		t.Logf("seed %d: %d operations linearizable, checked in %v", seed, res.Ops, time.Since(start).Round(time.Millisecond))

		// The same history with one later registration granted an
		// earlier registration's id is not.
		var first, later int = -1, -1
		for i, op := range ops {
			if op.Input.Kind == Register && op.Output.Outcome == OK {
				if first < 0 {
					first = i
				} else if op.Output.ID != ops[first].Output.ID && op.Input.Endpoint != ops[first].Input.Endpoint && op.Call > ops[first].Return {
					later = i
					break
				}
			}
		}
		bad := append([]Op(nil), ops...)
		bad[later].Output.ID = ops[first].Output.ID
		if _, err := Check(bad, Options{WorkerTimeout: timeout, Timeout: 30 * time.Second}); !errors.Is(err, ErrNotLinearizable) {
			t.Fatalf("seed %d: id %d granted twice: want not linearizable, got %v", seed, ops[first].Output.ID, err)
		}
	}
}

// BenchmarkCheck checks a simulated history of 1500 operations (two
// readers and four endpoints' workers, overlapping).
func BenchmarkCheck(b *testing.B) {
	ops := simulate(1, 1500)
	for b.Loop() {
		if _, err := Check(ops, Options{WorkerTimeout: timeout, Timeout: time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
}
