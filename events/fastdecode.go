package events

import (
	"bytes"
	"math"
	"math/bits"
	"time"
	"unicode/utf8"
)

// The one-pass decoder.
//
// decodeTwoPass (encoding/json into the envelope with the data left raw,
// then encoding/json again into the payload's type) defines what a body
// means. decodeOnePass reads the common form of a body, the one Encode
// writes, in a single pass without reflection, and gives up (ok false) on
// anything it is not sure to read exactly as decodeTwoPass does:
//
//   - a key that is not one of the type's json names, spelled exactly (so
//     case-folded and unknown keys, which encoding/json matches or skips),
//     or a key that appears twice;
//   - "data" before "type";
//   - null (but for a map or a slice), a string with an escape or invalid UTF-8, a number with a
//     fraction or an exponent, or one that overflows its field;
//   - anything that is not valid JSON, and any body that decodeTwoPass
//     would refuse (wrong version, unknown type, no data).
//
// Decode and DecodeLine then fall back to decodeTwoPass, so every error,
// and the meaning of every body, is still decodeTwoPass's. The differential
// tests and fuzz targets in codec_test.go check that the two agree on every
// input, and that every kind written by Encode takes the one pass.

// scanner reads JSON from b at i. The first thing it cannot read exactly
// sets bad; from then on every read fails and the caller gives up.
type scanner struct {
	b   []byte
	i   int
	bad bool
}

func (s *scanner) fail() { s.bad = true }

// ws skips JSON whitespace.
func (s *scanner) ws() {
	if s.i < len(s.b) && s.b[s.i] > ' ' {
		return // the common case: no whitespace
	}
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// consume reads the byte c after whitespace.
func (s *scanner) consume(c byte) bool {
	if s.bad {
		return false
	}
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	s.fail()
	return false
}

// peek reports whether the next byte after whitespace is c, without
// reading it.
func (s *scanner) peek(c byte) bool {
	s.ws()
	return !s.bad && s.i < len(s.b) && s.b[s.i] == c
}

// open reads the '{' of an object and reports whether a member follows.
// Iterate members with: for more := s.open(); more; more = s.more().
func (s *scanner) open() bool {
	if !s.consume('{') {
		return false
	}
	if s.peek('}') {
		s.i++
		return false
	}
	return !s.bad
}

// more reads the ',' or '}' after a member and reports whether another
// member follows.
func (s *scanner) more() bool {
	if s.bad {
		return false
	}
	s.ws()
	if s.i < len(s.b) {
		switch s.b[s.i] {
		case ',':
			s.i++
			return true
		case '}':
			s.i++
			return false
		}
	}
	s.fail()
	return false
}

// key reads a member's key and its ':'.
func (s *scanner) key() []byte {
	k := s.raw()
	s.consume(':')
	return k
}

// field reads a member's key and returns its index in names, failing on
// any other key and on a key already seen (a bit in *seen). It tries the
// name after the last one seen first: Encode writes them in order.
func (s *scanner) field(seen *uint32, names ...string) int {
	if s.bad {
		return -1
	}
	s.ws()
	// The bits of *seen below the first unseen name are all set when the
	// keys come in order.
	if next := bits.TrailingZeros32(^*seen); next < len(names) {
		if k := s.b[s.i:]; len(k) > len(names[next])+1 && k[0] == '"' &&
			string(k[1:1+len(names[next])]) == names[next] && k[1+len(names[next])] == '"' {
			s.i += len(names[next]) + 2
			s.consume(':')
			*seen |= 1 << next
			return next
		}
	}
	k := s.key()
	if s.bad {
		return -1
	}
	for i, n := range names {
		if string(k) == n {
			if *seen&(1<<i) != 0 {
				break
			}
			*seen |= 1 << i
			return i
		}
	}
	s.fail()
	return -1
}

// Classes of a byte inside a JSON string, for raw.
const (
	strPlain   = iota // ASCII that stands for itself
	strQuote          // the end of the string
	strRefused        // an escape or a control byte: raw gives up
	strHigh           // a byte of a multi-byte UTF-8 sequence (to validate)
)

// strClass is the class of every byte; read-only.
var strClass = func() (c [256]uint8) {
	for i := range c {
		switch {
		case i == '"':
			c[i] = strQuote
		case i == '\\' || i < 0x20:
			c[i] = strRefused
		case i >= utf8.RuneSelf:
			c[i] = strHigh
		}
	}
	return c
}()

// raw reads a string without escapes that is valid UTF-8, and returns its
// bytes (which encoding/json would return unchanged).
func (s *scanner) raw() []byte {
	if !s.consume('"') {
		return nil
	}
	rest, ascii := s.b[s.i:], true
	for j, c := range rest {
		switch strClass[c] {
		case strPlain:
			continue
		case strQuote:
			if out := rest[:j]; ascii || utf8.Valid(out) {
				s.i += j + 1
				return out
			}
		case strHigh:
			ascii = false
			continue
		}
		break
	}
	s.fail()
	return nil
}

func (s *scanner) string() string {
	b := s.raw()
	if s.bad {
		return ""
	}
	return string(b)
}

// digits reads a JSON integer without sign (no leading zero, no fraction,
// no exponent) that fits in a uint64.
func (s *scanner) digits() uint64 {
	if s.bad {
		return 0
	}
	b, i := s.b, s.i
	if i >= len(b) || b[i] < '0' || b[i] > '9' {
		s.fail()
		return 0
	}
	var n uint64
	if b[i] == '0' {
		i++
	} else {
		for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			d := uint64(b[i] - '0')
			if n > (math.MaxUint64-d)/10 {
				s.fail()
				return 0
			}
			n = n*10 + d
		}
	}
	if i < len(b) {
		switch b[i] {
		case '.', 'e', 'E', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			s.fail()
			return 0
		}
	}
	s.i = i
	return n
}

func (s *scanner) uint64() uint64 {
	s.ws()
	return s.digits()
}

func (s *scanner) int() int {
	s.ws()
	neg := s.i < len(s.b) && s.b[s.i] == '-'
	if neg {
		s.i++
	}
	u := s.digits()
	switch {
	case !neg && u <= math.MaxInt:
		return int(u)
	case neg && u <= -math.MinInt:
		return int(-u)
	}
	s.fail()
	return 0
}

// time reads a time as encoding/json does: it hands the quoted string to
// time.Time.UnmarshalJSON.
func (s *scanner) time() time.Time {
	s.ws()
	start := s.i
	s.raw()
	if s.bad {
		return time.Time{}
	}
	var t time.Time
	if err := t.UnmarshalJSON(s.b[start:s.i]); err != nil {
		s.fail()
	}
	return t
}

// bool reads true or false, or null (false: the field of a new payload
// stays as it is, as encoding/json leaves it).
func (s *scanner) bool() bool {
	if s.null() {
		return false
	}
	switch {
	case s.bad:
	case bytes.HasPrefix(s.b[s.i:], []byte("true")):
		s.i += 4
		return true
	case bytes.HasPrefix(s.b[s.i:], []byte("false")):
		s.i += 5
		return false
	}
	s.fail()
	return false
}

// null reads a null if one is next.
func (s *scanner) null() bool {
	s.ws()
	if !s.bad && bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// replicas reads a {"<uint64>": "<string>"} object into a new map, or null
// (nil: the field of a new payload stays as it is).
func (s *scanner) replicas() map[uint64]string {
	if s.null() {
		return nil
	}
	m := make(map[uint64]string)
	for more := s.open(); more; more = s.more() {
		k := s.key()
		if s.bad {
			return nil
		}
		// encoding/json parses a map key with strconv.ParseUint(k, 10, 64):
		// decimal digits, leading zeros allowed.
		if len(k) == 0 {
			s.fail()
			return nil
		}
		var id uint64
		for _, c := range k {
			if c < '0' || c > '9' || id > (math.MaxUint64-uint64(c-'0'))/10 {
				s.fail()
				return nil
			}
			id = id*10 + uint64(c-'0')
		}
		m[id] = s.string()
	}
	return m
}

// strings reads an array of strings, [] as an empty, non-nil slice, or
// null (nil).
func (s *scanner) strings() []string {
	if s.null() {
		return nil
	}
	if !s.consume('[') {
		return nil
	}
	out := []string{}
	if s.peek(']') {
		s.i++
		return out
	}
	for !s.bad {
		out = append(out, s.string())
		if s.peek(',') {
			s.i++
			continue
		}
		s.consume(']')
		break
	}
	return out
}

// decodeOnePass decodes body in one pass, or reports that it cannot
// (ok false). withSeq reads the JSONL form, which has a non-zero "seq";
// without it, seq is the event's seq.
func decodeOnePass(seq uint64, body []byte, withSeq bool) (ev Event, ok bool) {
	s := scanner{b: body}
	var (
		seen    uint32
		version uint64
		kind    = -1
	)
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "v", "term", "writer", "at", "type", "data", "seq") {
		case 0:
			version = s.uint64()
		case 1:
			ev.Term = s.uint64()
		case 2:
			ev.Writer = s.string()
		case 3:
			ev.At = s.time()
		case 4:
			kind = kindIndex(s.raw())
			if kind < 0 {
				s.fail()
			}
		case 5:
			if kind < 0 {
				s.fail() // the data of a type not known yet
				break
			}
			ev.Data = decoderList[kind].onePass(&s)
		case 6:
			if !withSeq {
				s.fail()
				break
			}
			seq = s.uint64()
		}
	}
	s.ws()
	if s.bad || s.i != len(s.b) || version != Version || ev.Data == nil || seq == 0 && withSeq {
		return Event{}, false
	}
	ev.Seq = seq
	return ev, true
}

// kindIndex is the index in decoderList of the type named t, or -1.
func kindIndex(t []byte) int {
	for i := range decoderList {
		if string(t) == decoderList[i].typ {
			return i
		}
	}
	return -1
}

// The one-pass readers of the payloads, one per shape. Each lists the json
// names of its type's fields in the order of its switch.

func onePassTermStarted(s *scanner) Payload {
	var p TermStarted
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "term", "leader", "lease") {
		case 0:
			p.Term = s.uint64()
		case 1:
			p.Leader = s.string()
		case 2:
			p.Lease = s.uint64()
		}
	}
	return p
}

func onePassWorkerRegistered(s *scanner) Payload {
	var p WorkerRegistered
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "id", "epoch", "incarnation", "endpoint", "kind", "parallelism") {
		case 0:
			p.ID = s.uint64()
		case 1:
			p.Epoch = s.uint64()
		case 2:
			p.Incarnation = s.string()
		case 3:
			p.Endpoint = s.string()
		case 4:
			p.Kind = s.string()
		case 5:
			p.Parallelism = s.int()
		}
	}
	return p
}

// workerRef is the shape of WorkerActivated, WorkerExpired and
// WorkerDeregistered.
func workerRef(s *scanner) WorkerActivated {
	var p WorkerActivated
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "id", "epoch") {
		case 0:
			p.ID = s.uint64()
		case 1:
			p.Epoch = s.uint64()
		}
	}
	return p
}

func onePassStoreRegistered(s *scanner) Payload {
	var p StoreRegistered
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "store", "incarnation", "raft_addr") {
		case 0:
			p.Store = s.string()
		case 1:
			p.Incarnation = s.string()
		case 2:
			p.RaftAddr = s.string()
		}
	}
	return p
}

func onePassStoreState(s *scanner) Payload {
	var p StoreState
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "store", "state", "until", "stopping") {
		case 0:
			p.Store = s.string()
		case 1:
			p.State = s.string()
		case 2:
			p.Until = s.time()
		case 3:
			p.Stopping = s.bool()
		}
	}
	return p
}

func onePassShardCreated(s *scanner) Payload {
	var p ShardCreated
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "shard", "replicas") {
		case 0:
			p.Shard = s.uint64()
		case 1:
			p.Replicas = s.replicas()
		}
	}
	return p
}

func replicaChange(s *scanner) ReplicaChange {
	var p ReplicaChange
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "shard", "replica", "store", "ccid", "op", "note") {
		case 0:
			p.Shard = s.uint64()
		case 1:
			p.Replica = s.uint64()
		case 2:
			p.Store = s.string()
		case 3:
			p.CCID = s.uint64()
		case 4:
			p.Op = s.string()
		case 5:
			p.Note = s.string()
		}
	}
	return p
}

func onePassShardObserved(s *scanner) Payload {
	var p ShardObserved
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "shard", "ccid", "replicas", "leader") {
		case 0:
			p.Shard = s.uint64()
		case 1:
			p.CCID = s.uint64()
		case 2:
			p.Replicas = s.replicas()
		case 3:
			p.Leader = s.uint64()
		}
	}
	return p
}

func operator(s *scanner) Operator {
	var p Operator
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "op", "shard", "steps", "reason", "remove", "add") {
		case 0:
			p.Op = s.string()
		case 1:
			p.Shard = s.uint64()
		case 2:
			p.Steps = s.strings()
		case 3:
			p.Reason = s.string()
		case 4:
			p.Remove = s.uint64()
		case 5:
			p.Add = s.string()
		}
	}
	return p
}

func onePassShardBlocked(s *scanner) Payload {
	var p ShardBlocked
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "shard", "reason") {
		case 0:
			p.Shard = s.uint64()
		case 1:
			p.Reason = s.string()
		}
	}
	return p
}

func onePassShardRecovered(s *scanner) Payload {
	var p ShardRecovered
	var seen uint32
	for more := s.open(); more; more = s.more() {
		switch s.field(&seen, "shard", "replica", "store", "applied", "gone", "operator", "reason") {
		case 0:
			p.Shard = s.uint64()
		case 1:
			p.Replica = s.uint64()
		case 2:
			p.Store = s.string()
		case 3:
			p.Applied = s.uint64()
		case 4:
			p.Gone = s.replicas()
		case 5:
			p.Operator = s.string()
		case 6:
			p.Reason = s.string()
		}
	}
	return p
}
