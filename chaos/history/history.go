// Package history checks a history of the operations clients of a termlog
// cluster perform (worker register, activate, heartbeat and deregister
// replies, and `status` reads with their seq), each with its invoke and
// return time, for linearizability against a sequential model of the
// worker registry with github.com/anishathalye/porcupine. The chaos suite
// records them (chaos.OpLog) and converts them (chaos.ToHistory).
//
// The model's properties:
//   - ids are never reused: an id, once seen, always names the same
//     registration (endpoint, incarnation, epoch);
//   - at most one active id per endpoint: a read never shows two, and a
//     registration at an endpoint removes the one before it there (so a
//     heartbeat of the replaced one is never accepted again);
//   - a registration acknowledged (or seen in a read) once stays visible
//     until it is deregistered, replaced at its endpoint, or may have
//     expired: a heartbeat told it to re-register, or the worker timeout
//     has passed since the invocation of its last acknowledged heartbeat;
//     a registration once gone never comes back;
//   - reads never go back in seq, and a read linearized after an
//     acknowledged registration has a seq at least its epoch (the
//     registration's own seq).
//
// Operations whose outcome is unknown (a timeout, a lost reply) are kept:
// an unknown deregistration may have removed its worker at any point after
// its invocation; an unknown registration may have registered a worker,
// which a later read then shows (the model adopts it).
package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Kind is the kind of a client operation.
type Kind string

// The operations the model knows.
const (
	Register   Kind = "register"
	Activate   Kind = "activate"
	Heartbeat  Kind = "heartbeat"
	Deregister Kind = "deregister"
	Read       Kind = "read" // `termlog status -o json`
)

// Outcome is how an operation ended.
type Outcome string

// Outcomes. Unknown is any failure after which the operation may or may
// not have taken effect (a timeout, a lost connection, not_leader after a
// retry budget ran out).
const (
	OK         Outcome = "ok"
	Reregister Outcome = "reregister" // the leader does not know the registration (client.CodeReregister)
	Forbidden  Outcome = "forbidden"  // another incarnation's registration (client.CodeForbidden)
	Unknown    Outcome = "unknown"
)

// Input is what an operation asked.
type Input struct {
	Kind Kind `json:"kind"`
	// Register: the incarnation and endpoint registering.
	Incarnation string `json:"incarnation,omitempty"`
	Endpoint    string `json:"endpoint,omitempty"`
	// Activate, heartbeat, deregister: the registration named.
	ID    uint64 `json:"id,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
}

// Worker is one worker as a read shows it.
type Worker struct {
	ID          uint64 `json:"id"`
	Epoch       uint64 `json:"epoch"`
	Incarnation string `json:"incarnation"`
	Endpoint    string `json:"endpoint"`
	State       string `json:"state,omitempty"`
}

// Output is what an operation returned.
type Output struct {
	Outcome Outcome `json:"outcome"`
	// Register: the id and epoch granted.
	ID    uint64 `json:"id,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
	// Read: the seq the read reflects and the workers it lists.
	Seq     uint64   `json:"seq,omitempty"`
	Workers []Worker `json:"workers,omitempty"`
	// Err is the error text of a failed operation (for people only).
	Err string `json:"err,omitempty"`
}

// Op is one recorded operation. Call and Return are offsets from the
// history's start (chaos.ToHistory measures them from its first
// invocation); Return is 0 while the operation is pending (a pending
// operation is checked as Unknown).
type Op struct {
	Client string        `json:"client"`
	Input  Input         `json:"input"`
	Output Output        `json:"output"`
	Call   time.Duration `json:"call"`
	Return time.Duration `json:"return"`
	Done   bool          `json:"done"`
}

// WriteJSONL writes ops one a line, so a failed run's history can be
// checked again with ReadJSONL and Check.
func WriteJSONL(w io.Writer, ops []Op) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, op := range ops {
		if err := enc.Encode(op); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// ReadJSONL reads what WriteJSONL wrote.
func ReadJSONL(r io.Reader) ([]Op, error) {
	var ops []Op
	dec := json.NewDecoder(r)
	for {
		var op Op
		err := dec.Decode(&op)
		if errors.Is(err, io.EOF) {
			return ops, nil
		}
		if err != nil {
			return ops, fmt.Errorf("history line %d: %w", len(ops)+1, err)
		}
		ops = append(ops, op)
	}
}

// SaveJSONL writes ops to path.
func SaveJSONL(path string, ops []Op) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteJSONL(f, ops); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
