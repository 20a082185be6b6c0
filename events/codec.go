package events

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Decode errors. A DecodeError wraps exactly one of these, so callers match
// them with errors.Is and still learn the seq (or line) from the DecodeError.
var (
	ErrMalformed      = errors.New("malformed event")
	ErrUnknownVersion = errors.New("unknown event version")
	ErrUnknownType    = errors.New("unknown event type")
)

// DecodeError reports an event that could not be decoded, with where it was.
type DecodeError struct {
	Seq  uint64 // stream sequence, 0 when unknown
	Line int    // JSONL line number, 0 when not read from a file
	Type string // the type field, when it could be read
	Err  error  // one of ErrMalformed, ErrUnknownVersion, ErrUnknownType
	Why  string // detail
}

func (e *DecodeError) Error() string {
	var b strings.Builder
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Seq > 0 {
		fmt.Fprintf(&b, "seq %d: ", e.Seq)
	}
	b.WriteString(e.Err.Error())
	if e.Type != "" {
		fmt.Fprintf(&b, " %q", e.Type)
	}
	if e.Why != "" {
		b.WriteString(": ")
		b.WriteString(e.Why)
	}
	return b.String()
}

func (e *DecodeError) Unwrap() error { return e.Err }

// Envelope is the wire form of an event body, its data left raw: what
// Encode writes, what Decode reads (the one definition of the body's JSON
// fields and their order; a JSONL export line is "seq" and then these).
type Envelope = EnvelopeOf[time.Time]

// EnvelopeOf is Envelope with the time as T: EnvelopeOf[json.RawMessage]
// writes the "at" text as it was written (offset and precision kept, byte
// for byte), where Envelope writes a time.Time.
type EnvelopeOf[T any] struct {
	V      int             `json:"v"`
	Term   uint64          `json:"term"`
	Writer string          `json:"writer"`
	At     T               `json:"at"`
	Type   string          `json:"type"`
	Data   json.RawMessage `json:"data"`
}

// envelope is Envelope as the codec decodes it: decode errors name the
// type ("cannot unmarshal array into Go value of type events.envelope"),
// and replay's and the scripts' outputs quote them.
type envelope Envelope

// line is the JSONL export form: the envelope plus the seq.
type line struct {
	Seq uint64 `json:"seq"`
	envelope
}

// Encode returns the body of an event as stored in the stream (no seq).
// A sealed event's body is returned as Seal made it, not encoded again.
func Encode(ev Event) ([]byte, error) {
	if ev.body != nil {
		return ev.body, nil
	}
	env, err := toEnvelope(ev)
	if err != nil {
		return nil, err
	}
	return json.Marshal(env)
}

// Seal encodes ev once: it returns ev carrying its body, which Encode (and
// so every Log's Append) then returns without encoding it again, and the
// body. The caller must not change the sealed event's fields (other than
// Seq, which is not encoded) nor the body.
func Seal(ev Event) (Event, []byte, error) {
	ev.body = nil
	b, err := Encode(ev)
	if err != nil {
		return ev, nil, err
	}
	ev.body = b
	return ev, b, nil
}

// EncodeLine returns one JSONL export line for ev, seq included, without the
// trailing newline.
func EncodeLine(ev Event) ([]byte, error) {
	env, err := toEnvelope(ev)
	if err != nil {
		return nil, err
	}
	return json.Marshal(line{Seq: ev.Seq, envelope: env})
}

func toEnvelope(ev Event) (envelope, error) {
	if ev.Data == nil {
		return envelope{}, fmt.Errorf("encode event: no payload")
	}
	if _, ok := decoders[ev.Data.Type()]; !ok {
		return envelope{}, fmt.Errorf("encode event: %w %q", ErrUnknownType, ev.Data.Type())
	}
	data, err := json.Marshal(ev.Data)
	if err != nil {
		return envelope{}, fmt.Errorf("encode %s: %w", ev.Data.Type(), err)
	}
	return envelope{V: Version, Term: ev.Term, Writer: ev.Writer, At: ev.At.UTC(), Type: ev.Data.Type(), Data: data}, nil
}

// Decode decodes the body of the message at seq. Errors are *DecodeError.
//
// It reads the common form of a body in one pass (decodeOnePass) and
// everything else, errors included, as decodeTwoPass does; the two agree on
// every input.
func Decode(seq uint64, body []byte) (Event, error) {
	if ev, ok := decodeOnePass(seq, body, false); ok {
		return ev, nil
	}
	return decodeTwoPass(seq, body)
}

// DecodeLine decodes one JSONL export line. Errors are *DecodeError.
func DecodeLine(b []byte) (Event, error) {
	if ev, ok := decodeOnePass(0, b, true); ok {
		return ev, nil
	}
	return decodeLineTwoPass(b)
}

// decodeTwoPass defines what a body means: encoding/json into the envelope
// with the data left raw, then into the payload type the envelope names.
func decodeTwoPass(seq uint64, body []byte) (Event, error) {
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil {
		return Event{Seq: seq}, &DecodeError{Seq: seq, Err: ErrMalformed, Why: err.Error()}
	}
	return fromEnvelope(seq, env)
}

// decodeLineTwoPass is decodeTwoPass for a JSONL line.
func decodeLineTwoPass(b []byte) (Event, error) {
	var l line
	if err := json.Unmarshal(b, &l); err != nil {
		return Event{}, &DecodeError{Err: ErrMalformed, Why: err.Error()}
	}
	if l.Seq == 0 {
		return Event{}, &DecodeError{Err: ErrMalformed, Type: l.Type, Why: "missing seq"}
	}
	return fromEnvelope(l.Seq, l.envelope)
}

func fromEnvelope(seq uint64, env envelope) (Event, error) {
	ev := Event{Seq: seq, Term: env.Term, Writer: env.Writer, At: env.At}
	if env.V != Version {
		return ev, &DecodeError{Seq: seq, Type: env.Type, Err: ErrUnknownVersion, Why: fmt.Sprintf("v=%d, this build reads v=%d", env.V, Version)}
	}
	dec, ok := decoders[env.Type]
	if !ok {
		return ev, &DecodeError{Seq: seq, Type: env.Type, Err: ErrUnknownType}
	}
	if len(env.Data) == 0 || env.Data[0] != '{' {
		return ev, &DecodeError{Seq: seq, Type: env.Type, Err: ErrMalformed, Why: "data is not an object"}
	}
	p, err := dec(env.Data)
	if err != nil {
		return ev, &DecodeError{Seq: seq, Type: env.Type, Err: ErrMalformed, Why: err.Error()}
	}
	ev.Data = p
	return ev, nil
}

type decoderEntry struct {
	typ     string
	dec     func([]byte) (Payload, error) // decodeTwoPass's second pass
	onePass func(*scanner) Payload        // decodeOnePass's reader of the data
}

func decodeAs[T Payload](b []byte) (Payload, error) {
	var p T
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return p, nil
}

// decoderList is read-only after init; it is the single table of kinds.
var decoderList = []decoderEntry{
	{TypeTermStarted, decodeAs[TermStarted], onePassTermStarted},
	{TypeWorkerRegistered, decodeAs[WorkerRegistered], onePassWorkerRegistered},
	{TypeWorkerActivated, decodeAs[WorkerActivated], func(s *scanner) Payload { return workerRef(s) }},
	{TypeWorkerExpired, decodeAs[WorkerExpired], func(s *scanner) Payload { return WorkerExpired(workerRef(s)) }},
	{TypeWorkerDeregistered, decodeAs[WorkerDeregistered], func(s *scanner) Payload { return WorkerDeregistered(workerRef(s)) }},
	{TypeStoreRegistered, decodeAs[StoreRegistered], onePassStoreRegistered},
	{TypeStoreState, decodeAs[StoreState], onePassStoreState},
	{TypeShardCreated, decodeAs[ShardCreated], onePassShardCreated},
	{TypeShardReplicaAdding, decodeAs[ShardReplicaAdding], func(s *scanner) Payload { return ShardReplicaAdding(replicaChange(s)) }},
	{TypeShardReplicaAdded, decodeAs[ShardReplicaAdded], func(s *scanner) Payload { return ShardReplicaAdded(replicaChange(s)) }},
	{TypeShardReplicaRemove, decodeAs[ShardReplicaRemoving], func(s *scanner) Payload { return ShardReplicaRemoving(replicaChange(s)) }},
	{TypeShardReplicaRemoved, decodeAs[ShardReplicaRemoved], func(s *scanner) Payload { return ShardReplicaRemoved(replicaChange(s)) }},
	{TypeShardObserved, decodeAs[ShardObserved], onePassShardObserved},
	{TypeOperatorStarted, decodeAs[OperatorStarted], func(s *scanner) Payload { return OperatorStarted(operator(s)) }},
	{TypeOperatorFinished, decodeAs[OperatorFinished], func(s *scanner) Payload { return OperatorFinished(operator(s)) }},
	{TypeOperatorFailed, decodeAs[OperatorFailed], func(s *scanner) Payload { return OperatorFailed(operator(s)) }},
	{TypeShardBlocked, decodeAs[ShardBlocked], onePassShardBlocked},
	{TypeShardRecovered, decodeAs[ShardRecovered], onePassShardRecovered},
}

var decoders = func() map[string]func([]byte) (Payload, error) {
	m := make(map[string]func([]byte) (Payload, error), len(decoderList))
	for _, d := range decoderList {
		m[d.typ] = d.dec
	}
	return m
}()

// MaxLineBytes bounds one JSONL line (and one event body).
const MaxLineBytes = 1 << 20

// JSONLReader reads a JSONL export one event at a time.
type JSONLReader struct {
	sc   *bufio.Scanner
	line int
}

// NewJSONLReader reads JSONL from r.
func NewJSONLReader(r io.Reader) *JSONLReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), MaxLineBytes)
	return &JSONLReader{sc: sc}
}

// Next returns the next event. It returns io.EOF at the end. A line that does
// not decode yields a *DecodeError naming the line (and its seq when it could
// be read); reading can continue after it. Blank lines are skipped.
func (r *JSONLReader) Next() (Event, error) {
	for r.sc.Scan() {
		r.line++
		b := bytes.TrimSpace(r.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		ev, err := DecodeLine(b)
		if err != nil {
			var de *DecodeError
			if errors.As(err, &de) {
				de.Line = r.line
				if de.Seq == 0 {
					de.Seq = ev.Seq
				}
			}
			return ev, err
		}
		return ev, nil
	}
	if err := r.sc.Err(); err != nil {
		return Event{}, fmt.Errorf("line %d: %w", r.line+1, err)
	}
	return Event{}, io.EOF
}

// Line is the number of the line last read.
func (r *JSONLReader) Line() int { return r.line }

// WriteJSONL writes one event as a JSONL line.
func WriteJSONL(w io.Writer, ev Event) error {
	b, err := EncodeLine(ev)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}
