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
	// Anything else is the reply's error code (client.Code*): the request
	// was refused and changed nothing.
)

// Op is one client operation with its invoke and return times, as the
// client saw it. A history checker (chaos/history) reads these.
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
	Return time.Time `json:"return"`

	Outcome string `json:"outcome"`
	// Register's reply: the id and epoch granted; every reply's term.
	ReplyID    uint64 `json:"reply_id,omitempty"`
	ReplyEpoch uint64 `json:"reply_epoch,omitempty"`
	Term       uint64 `json:"term,omitempty"`

	// Status: the seq it read and the workers it listed.
	Seq     uint64         `json:"seq,omitempty"`
	Workers []StatusWorker `json:"workers,omitempty"`
}

// Recorder receives every client operation once it has returned.
type Recorder interface {
	Record(Op)
}

// OpLog is a Recorder that keeps the operations in memory.
type OpLog struct {
	mu  sync.Mutex
	ops []Op
}

func (l *OpLog) Record(op Op) {
	l.mu.Lock()
	l.ops = append(l.ops, op)
	l.mu.Unlock()
}

// Ops returns a copy of the operations recorded so far.
func (l *OpLog) Ops() []Op {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Op(nil), l.ops...)
}

// Reset forgets everything recorded (the next schedule starts a history).
func (l *OpLog) Reset() {
	l.mu.Lock()
	l.ops = nil
	l.mu.Unlock()
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
