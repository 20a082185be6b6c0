package history

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// status of a registration in the model.
type status uint8

const (
	present   status = iota
	mayVanish        // may be gone already: an unknown deregistration, or a heartbeat told it to re-register
	gone             // deregistered, replaced at its endpoint, or missing from a read: never seen again
)

func (s status) String() string {
	return [...]string{"present", "may-vanish", "gone"}[s]
}

// reg is one registration the model has seen (acknowledged or read).
type reg struct {
	endpoint    string
	incarnation string
	epoch       uint64
	status      status
	// life is the invocation time of its last acknowledged register,
	// activate or heartbeat: the leader's deadline for it is at least
	// life + the worker timeout, so it cannot expire before. hasLife is
	// false for a registration first seen in a read (no lower bound).
	life    time.Duration
	hasLife bool
}

// state is the model's state. Steps never modify a state: they copy it.
type state struct {
	seq  uint64 // no read may be below it
	regs map[uint64]reg
}

func (s state) clone() state {
	c := state{seq: s.seq, regs: make(map[uint64]reg, len(s.regs)+1)}
	for id, r := range s.regs {
		c.regs[id] = r
	}
	return c
}

func (s state) ids() []uint64 {
	ids := make([]uint64, 0, len(s.regs))
	for id := range s.regs {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

func (s state) equal(o state) bool {
	if s.seq != o.seq || len(s.regs) != len(o.regs) {
		return false
	}
	for id, r := range s.regs {
		if q, ok := o.regs[id]; !ok || q != r {
			return false
		}
	}
	return true
}

func (s state) hash() uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d|", s.seq)
	for _, id := range s.ids() {
		r := s.regs[id]
		fmt.Fprintf(h, "%d %s %s %d %d %d %t|", id, r.endpoint, r.incarnation, r.epoch, r.status, r.life, r.hasLife)
	}
	return h.Sum64()
}

func (s state) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seq>=%d", s.seq)
	for _, id := range s.ids() {
		r := s.regs[id]
		if r.status == gone {
			continue
		}
		fmt.Fprintf(&b, " %d@%s(e%d", id, r.endpoint, r.epoch)
		if r.status == mayVanish {
			b.WriteString(",may-vanish")
		}
		b.WriteString(")")
	}
	return b.String()
}

// call is a porcupine input: the operation with its times (the model
// compares them with the worker timeout).
type call struct {
	Op
	ret time.Duration // Return, or forever for an unknown outcome
	idx int           // its place in the checked history
}

const forever = time.Duration(math.MaxInt64)

// model is the sequential specification of the worker registry.
type model struct {
	timeout time.Duration
}

// step applies one operation to s; a non-nil error says why the operation
// cannot happen in state s.
func (m model) step(s state, c call) (state, error) {
	in, out := c.Input, c.Output
	switch in.Kind {
	case Register:
		return m.register(s, c)
	case Activate, Heartbeat:
		r, ok := s.regs[in.ID]
		if !ok {
			return s, nil // a registration the model never saw: nothing to check
		}
		switch out.Outcome {
		case OK:
			if r.epoch != in.Epoch {
				return s, fmt.Errorf("%s of worker %d epoch %d accepted, but id %d is the registration of epoch %d", in.Kind, in.ID, in.Epoch, in.ID, r.epoch)
			}
			if r.status == gone {
				return s, fmt.Errorf("%s of worker %d (epoch %d, %s) accepted after it was removed", in.Kind, in.ID, in.Epoch, r.endpoint)
			}
			n := s.clone()
			if !r.hasLife || c.Call > r.life {
				r.life, r.hasLife = c.Call, true
			}
			n.regs[in.ID] = r
			return n, nil
		case Reregister:
			if r.epoch != in.Epoch || r.status != present {
				return s, nil
			}
			if r.hasLife && c.ret-r.life < m.timeout {
				return s, fmt.Errorf("%s of worker %d (epoch %d, %s) told it to re-register %v after the invocation of its last acknowledged heartbeat (worker timeout %v)",
					in.Kind, in.ID, in.Epoch, r.endpoint, (c.ret - r.life).Round(time.Millisecond), m.timeout)
			}
			n := s.clone()
			r.status = mayVanish
			n.regs[in.ID] = r
			return n, nil
		}
		return s, nil
	case Deregister:
		r, ok := s.regs[in.ID]
		if !ok || r.epoch != in.Epoch || r.status == gone {
			return s, nil
		}
		switch out.Outcome {
		case OK:
			r.status = gone
		case Unknown:
			r.status = mayVanish
		default:
			return s, nil
		}
		n := s.clone()
		n.regs[in.ID] = r
		return n, nil
	case Read:
		return m.read(s, c)
	}
	return s, fmt.Errorf("unknown operation kind %q", in.Kind)
}

func (m model) register(s state, c call) (state, error) {
	in, out := c.Input, c.Output
	if out.Outcome != OK {
		return s, nil // an unknown registration shows up in a later read if it took effect
	}
	want := reg{endpoint: in.Endpoint, incarnation: in.Incarnation, epoch: out.Epoch}
	if r, ok := s.regs[out.ID]; ok {
		if r.endpoint != want.endpoint || r.incarnation != want.incarnation || r.epoch != want.epoch {
			return s, fmt.Errorf("id %d reused: granted to %s at %s (epoch %d), but it is already the registration of %s at %s (epoch %d)",
				out.ID, in.Incarnation, in.Endpoint, out.Epoch, r.incarnation, r.endpoint, r.epoch)
		}
		if r.status == gone {
			return s, fmt.Errorf("register at %s returned id %d (epoch %d), which was removed earlier", in.Endpoint, out.ID, out.Epoch)
		}
		n := s.clone()
		if !r.hasLife || c.Call > r.life {
			r.life, r.hasLife = c.Call, true
		}
		n.regs[out.ID] = r
		n.seq = max(n.seq, out.Epoch)
		return n, nil
	}
	want.life, want.hasLife = c.Call, true
	n := s.clone()
	if err := n.add(out.ID, want, fmt.Sprintf("register at %s", in.Endpoint)); err != nil {
		return s, err
	}
	n.seq = max(n.seq, out.Epoch)
	return n, nil
}

// add records a new registration in n (a state the caller owns): every
// older one at its endpoint is replaced (gone); a newer one there, or ids
// out of order with their epochs, cannot be.
func (n state) add(id uint64, r reg, what string) error {
	for oid, o := range n.regs {
		if (oid < id) != (o.epoch < r.epoch) || o.epoch == r.epoch {
			return fmt.Errorf("%s: id %d at epoch %d is out of order with id %d at epoch %d (ids are allocated in stream order, never reused)", what, id, r.epoch, oid, o.epoch)
		}
		if o.endpoint == r.endpoint && o.status != gone && oid > id {
			return fmt.Errorf("%s: id %d is older than id %d, acknowledged there already (one active id per endpoint: the newer replaced the older)", what, id, oid)
		}
	}
	for oid, o := range n.regs {
		if o.endpoint == r.endpoint && o.status != gone {
			o.status = gone
			n.regs[oid] = o
		}
	}
	n.regs[id] = r
	return nil
}

func (m model) read(s state, c call) (state, error) {
	out := c.Output
	if out.Outcome != OK {
		return s, nil
	}
	if out.Seq < s.seq {
		return s, fmt.Errorf("read at seq %d went back: an earlier read or acknowledged registration reached seq %d", out.Seq, s.seq)
	}
	what := fmt.Sprintf("read at seq %d", out.Seq)
	at := map[string]uint64{}
	shown := map[uint64]bool{}
	for _, w := range out.Workers {
		if prev, dup := at[w.Endpoint]; dup {
			return s, fmt.Errorf("%s shows two active ids at endpoint %s: %d and %d", what, w.Endpoint, prev, w.ID)
		}
		at[w.Endpoint] = w.ID
		shown[w.ID] = true
		if w.Epoch > out.Seq {
			return s, fmt.Errorf("%s shows worker %d registered at seq %d, after the read's seq", what, w.ID, w.Epoch)
		}
	}
	n := s.clone()
	for _, w := range out.Workers {
		r, ok := n.regs[w.ID]
		if !ok {
			if err := n.add(w.ID, reg{endpoint: w.Endpoint, incarnation: w.Incarnation, epoch: w.Epoch}, what); err != nil {
				return s, err
			}
			continue
		}
		if r.endpoint != w.Endpoint || r.incarnation != w.Incarnation || r.epoch != w.Epoch {
			return s, fmt.Errorf("%s: id %d reused: it shows %s at %s (epoch %d), but it is the registration of %s at %s (epoch %d)",
				what, w.ID, w.Incarnation, w.Endpoint, w.Epoch, r.incarnation, r.endpoint, r.epoch)
		}
		if r.status == gone {
			return s, fmt.Errorf("%s shows worker %d (epoch %d, %s) again after it was removed", what, w.ID, w.Epoch, w.Endpoint)
		}
		for oid, o := range n.regs {
			if o.endpoint == w.Endpoint && o.status != gone && oid > w.ID {
				return s, fmt.Errorf("%s shows id %d at %s, but id %d registered there later was acknowledged (one active id per endpoint)", what, w.ID, w.Endpoint, oid)
			}
		}
	}
	for _, id := range n.ids() {
		r := n.regs[id]
		if shown[id] || r.status == gone {
			continue
		}
		if r.endpoint != "" && at[r.endpoint] > id {
			r.status = gone // replaced by the newer one the read shows
			n.regs[id] = r
			continue
		}
		if r.status == present && r.hasLife && c.ret-r.life < m.timeout {
			return s, fmt.Errorf("%s: acknowledged registration %d (epoch %d, %s) is missing, only %v after the invocation of its last acknowledged heartbeat (worker timeout %v)",
				what, id, r.epoch, r.endpoint, (c.ret - r.life).Round(time.Millisecond), m.timeout)
		}
		r.status = gone // expired or deregistered
		n.regs[id] = r
	}
	n.seq = out.Seq
	return n, nil
}

// porcupine returns the model for porcupine.
func (m model) porcupine() porcupine.Model {
	return porcupine.Model{
		Init: func() interface{} { return state{regs: map[uint64]reg{}} },
		Step: func(st, in, out interface{}) (bool, interface{}) {
			n, err := m.step(st.(state), in.(call))
			return err == nil, n
		},
		Equal: func(a, b interface{}) bool { return a.(state).equal(b.(state)) },
		Hash:  func(st interface{}) uint64 { return st.(state).hash() },
		DescribeOperation: func(in, out interface{}) string {
			return describe(in.(call).Op)
		},
		DescribeState: func(st interface{}) string { return st.(state).String() },
	}
}

// describe renders one operation for people.
func describe(op Op) string {
	in, out := op.Input, op.Output
	res := string(out.Outcome)
	if !op.Done {
		res = "pending"
	}
	switch in.Kind {
	case Register:
		if out.Outcome == OK {
			res = fmt.Sprintf("id %d epoch %d", out.ID, out.Epoch)
		}
		return fmt.Sprintf("register(%s, %s) -> %s", in.Endpoint, in.Incarnation, res)
	case Read:
		if out.Outcome != OK {
			return "read -> " + res
		}
		ws := make([]string, len(out.Workers))
		for i, w := range out.Workers {
			ws[i] = fmt.Sprintf("%d@%s", w.ID, w.Endpoint)
		}
		return fmt.Sprintf("read -> seq %d [%s]", out.Seq, strings.Join(ws, " "))
	default:
		return fmt.Sprintf("%s(%d, epoch %d) -> %s", in.Kind, in.ID, in.Epoch, res)
	}
}
