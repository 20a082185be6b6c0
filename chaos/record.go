package chaos

import (
	"encoding/json"
	"os"
	"sync"
	"time"
)

// OpKind is a client operation the runner records.
type OpKind string

const (
	OpRegister   OpKind = "register"
	OpActivate   OpKind = "activate"
	OpHeartbeat  OpKind = "heartbeat"
	OpDeregister OpKind = "deregister"
	OpStatus     OpKind = "status" // a `status -o json` read
)

// Outcomes of an operation.
const (
	OutcomeOK      = "ok"
	OutcomeUnknown = "unknown" // no reply (timeout, connection lost): it may or may not have taken effect
	// Anything else is the reply's error code (client.Code*).
)

// Op is one client operation with its invoke and return times, as the
// client saw it. The history checker (chaos/history) reads these.
type Op struct {
	Client string `json:"client"` // probe name, or "status"
	Kind   OpKind `json:"kind"`

	// Register: the request's endpoint and incarnation; activate,
	// heartbeat and deregister: the registration they name.
	Endpoint    string `json:"endpoint,omitempty"`
	Incarnation string `json:"incarnation,omitempty"`
	ID          uint64 `json:"id,omitempty"`
	Epoch       uint64 `json:"epoch,omitempty"`

	Invoke time.Time `json:"invoke"`
	Return time.Time `json:"return,omitzero"`
	Done   bool      `json:"done"` // false: still pending when the history was taken

	Outcome string `json:"outcome,omitempty"`
	// Register's reply: the id and epoch granted; every reply's term.
	ReplyID    uint64 `json:"reply_id,omitempty"`
	ReplyEpoch uint64 `json:"reply_epoch,omitempty"`
	Term       uint64 `json:"term,omitempty"`

	// Status: the seq it read and the workers it listed.
	Seq     uint64         `json:"seq,omitempty"`
	Workers []StatusWorker `json:"workers,omitempty"`
}

// Recorder records client operations: Invoke right before the request is
// sent, then the returned func with the outcome right after the reply (or
// the lack of one) arrived. An operation that never returns stays pending.
type Recorder interface {
	Invoke(op Op) (returned func(Op))
}

// OpLog is a Recorder that keeps one history in memory. Reset starts a new
// one once every operation in flight has returned, so no history holds an
// operation without its invocation, nor misses one that was in flight.
type OpLog struct {
	gate sync.RWMutex // held shared by every operation in flight
	mu   sync.Mutex
	ops  []Op
}

func (l *OpLog) Invoke(op Op) func(Op) {
	l.gate.RLock()
	l.mu.Lock()
	op.Invoke, op.Done = time.Now(), false
	l.ops = append(l.ops, op)
	i := len(l.ops) - 1
	l.mu.Unlock()
	var once sync.Once
	return func(out Op) {
		once.Do(func() {
			l.mu.Lock()
			out.Invoke, out.Return, out.Done = l.ops[i].Invoke, time.Now(), true
			l.ops[i] = out
			l.mu.Unlock()
			l.gate.RUnlock()
		})
	}
}

// Record adds an operation that has returned, with the Invoke and Return
// times its caller measured (for callers that time the operation
// themselves, like the partition scenarios' status reads).
func (l *OpLog) Record(op Op) {
	op.Done = true
	l.mu.Lock()
	l.ops = append(l.ops, op)
	l.mu.Unlock()
}

// Ops returns a copy of the operations recorded so far (pending ones with
// Done false).
func (l *OpLog) Ops() []Op {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Op(nil), l.ops...)
}

// Reset waits for the operations in flight, then forgets everything.
func (l *OpLog) Reset() {
	l.gate.Lock()
	l.mu.Lock()
	l.ops = nil
	l.mu.Unlock()
	l.gate.Unlock()
}

// Save writes the operations to path as JSON lines.
func (l *OpLog) Save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(f)
	for _, op := range l.Ops() {
		if err := enc.Encode(op); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
