package replay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"unicode/utf8"

	"github.com/termlog/termlog/events"
)

// Item is one entry of a log, in log order.
type Item struct {
	// Seq is the stream sequence; 0 when a damaged line does not say.
	Seq uint64
	// Line is the JSONL line number; 0 for the live stream.
	Line int
	// Event is the decoded event; when Err is set, only the envelope
	// fields that could be read.
	Event events.Event
	// Body is the stored body when there is one: every record of the live
	// stream, and raw lines of an export. Nil for ordinary JSONL lines.
	Body []byte
	// Err is set when the entry does not decode; it wraps an
	// *events.DecodeError (matched with errors.Is against
	// events.ErrMalformed, ErrUnknownVersion, ErrUnknownType).
	Err error
	// Damaged marks a JSONL line that is neither an event nor a raw line:
	// the file, not the log, is broken there.
	Damaged bool

	// line is the JSONL line as read (an event that decoded), for what
	// keeps the original bytes (ToScript).
	line []byte
}

// original returns the "at" text and the "data" bytes of the entry as
// stored: the stream's body, or the JSONL line. ok is false when they
// cannot be read.
func (it Item) original() (at string, data []byte, ok bool) {
	src := it.Body
	if src == nil {
		src = it.line
	}
	var o struct {
		At   json.RawMessage `json:"at"`
		Data json.RawMessage `json:"data"`
	}
	if src == nil || json.Unmarshal(src, &o) != nil || json.Unmarshal(o.At, &at) != nil || len(o.Data) == 0 {
		return "", nil, false
	}
	return at, o.Data, true
}

// Type is the event type, or for a corrupt entry the type field when it
// could be read ("" otherwise).
func (it Item) Type() string {
	if it.Err == nil {
		return it.Event.Type()
	}
	var de *events.DecodeError
	if errors.As(it.Err, &de) {
		return de.Type
	}
	return ""
}

// Source is a log to replay.
type Source interface {
	// Read calls fn for every entry in log order up to the end of the log
	// (as it was when Read was called), then returns nil. It stops early
	// with fn's error, or ctx's.
	Read(ctx context.Context, fn func(Item) error) error
}

// Follower is a Source that can also wait for new entries.
type Follower interface {
	Source
	// Follow is Read that does not stop at the end: it waits for new
	// entries until ctx is done (returning ctx.Err()) or fn fails.
	Follow(ctx context.Context, fn func(Item) error) error
}

// Stream is a Source (and Follower) over an events.Log, from seq 1.
func Stream(l events.Log) Follower { return logSource{l} }

type logSource struct{ l events.Log }

func (s logSource) Read(ctx context.Context, fn func(Item) error) error {
	return s.l.Read(ctx, 1, func(r events.Record) error { return fn(recordItem(r.Seq, r.Data, 0)) })
}

func (s logSource) ReadFrom(ctx context.Context, from uint64, fn func(Item) error) error {
	return s.l.Read(ctx, from, func(r events.Record) error { return fn(recordItem(r.Seq, r.Data, 0)) })
}

func (s logSource) Tail(ctx context.Context) (uint64, error) { return s.l.Tail(ctx) }

func (s logSource) Follow(ctx context.Context, fn func(Item) error) error {
	return s.l.Watch(ctx, 1, func(r events.Record) error { return fn(recordItem(r.Seq, r.Data, 0)) })
}

// recordItem decodes a stored body.
func recordItem(seq uint64, body []byte, line int) Item {
	if body == nil {
		body = []byte{}
	}
	ev, err := events.Decode(seq, body)
	// The error names the record only, not the line of a raw line: folded,
	// it must give the anomaly (and the hash) the live stream gives.
	return Item{Seq: seq, Line: line, Event: ev, Body: body, Err: err}
}

// JSONL is a Source over a JSONL export (see the package documentation for
// the format). It reads r once: a second Read continues where the first
// stopped. Blank lines are skipped; a line longer than events.MaxLineBytes
// is a damaged line, and reading goes on after it.
//
// Over an io.ReadSeeker (a file), Run and ToScript first read the whole
// input for damaged lines, so one is reported before any output.
func JSONL(r io.Reader) Source {
	return &jsonlSource{in: r, r: bufio.NewReaderSize(r, 64*1024)}
}

type jsonlSource struct {
	in   io.Reader
	r    *bufio.Reader
	line int
	err  error // sticky read error
}

// prechecker is a Source that can look for damaged entries before a read.
type prechecker interface {
	precheck(ctx context.Context) error
}

// precheck reads the rest of a seekable input and returns the first
// damaged line as Run would ("corrupt line: ..."), then rewinds.
func (s *jsonlSource) precheck(ctx context.Context) error {
	rs, ok := s.in.(io.ReadSeeker)
	if !ok || s.line > 0 || s.err != nil || s.r.Buffered() > 0 {
		return nil
	}
	start, err := rs.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil // not really seekable (a pipe): read it once
	}
	scan := &jsonlSource{in: rs, r: bufio.NewReaderSize(rs, 64*1024)}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		it, err := scan.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if it.Damaged {
			return fmt.Errorf("corrupt line: %w", it.Err)
		}
	}
	if _, err := rs.Seek(start, io.SeekStart); err != nil {
		return fmt.Errorf("rewind after checking the lines: %w", err)
	}
	s.r.Reset(rs)
	return nil
}

func (s *jsonlSource) Read(ctx context.Context, fn func(Item) error) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		it, err := s.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(it); err != nil {
			return err
		}
	}
}

// next returns the next non-blank line as an Item, io.EOF at the end, or a
// read error naming the line.
func (s *jsonlSource) next() (Item, error) {
	if s.err != nil {
		return Item{}, s.err
	}
	for {
		b, tooLong, err := s.readLine()
		if err != nil && (err != io.EOF || len(b) == 0 && !tooLong) {
			if err != io.EOF {
				err = fmt.Errorf("line %d: read: %w", s.line+1, err)
			}
			s.err = err
			return Item{}, err
		}
		s.line++
		if tooLong {
			return Item{Line: s.line, Damaged: true, Err: &events.DecodeError{
				Line: s.line, Err: events.ErrMalformed, Why: fmt.Sprintf("line longer than %d bytes", events.MaxLineBytes),
			}}, nil
		}
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			if err == io.EOF {
				s.err = io.EOF
				return Item{}, io.EOF
			}
			continue
		}
		return decodeLine(b, s.line), nil
	}
}

// readLine reads one line without its newline. A line longer than
// events.MaxLineBytes is consumed and reported as tooLong (b is then nil).
// At the end of input it returns what was left with io.EOF.
func (s *jsonlSource) readLine() (b []byte, tooLong bool, err error) {
	var buf []byte
	for {
		chunk, err := s.r.ReadSlice('\n')
		if !tooLong {
			if len(buf)+len(chunk) > events.MaxLineBytes+2 { // room for "\r\n"
				tooLong, buf = true, nil
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err != nil:
			return buf, tooLong, err
		default:
			return buf, tooLong, nil
		}
	}
}

// leadingSeq reads the seq of a line that starts as an export line does.
var leadingSeq = regexp.MustCompile(`^\{\s*"seq"\s*:\s*([0-9]{1,19})\s*[,}]`)

// rawLine is the export form of a stored record that does not decode.
type rawLine struct {
	Seq       uint64  `json:"seq"`
	Raw       *string `json:"raw,omitempty"`
	RawBase64 *string `json:"raw_base64,omitempty"`
	Error     string  `json:"error,omitempty"`
}

// decodeLine decodes one non-blank JSONL line.
func decodeLine(b []byte, line int) Item {
	ev, err := events.DecodeLine(b)
	if err == nil {
		// Import stores it re-encoded, in UTC: fold what the stream will hold.
		ev.At = ev.At.UTC()
		return Item{Seq: ev.Seq, Line: line, Event: ev, line: b}
	}
	var raw rawLine
	if json.Unmarshal(b, &raw) == nil && (raw.Raw != nil || raw.RawBase64 != nil) {
		body, why := raw.body()
		if why == "" && raw.Seq == 0 {
			why = "raw line without seq"
		}
		if why != "" {
			return Item{Seq: raw.Seq, Line: line, Damaged: true, Err: &events.DecodeError{Line: line, Seq: raw.Seq, Err: events.ErrMalformed, Why: why}}
		}
		return recordItem(raw.Seq, body, line)
	}
	var de *events.DecodeError
	if errors.As(err, &de) {
		de.Line = line
		if de.Seq == 0 {
			de.Seq = ev.Seq
		}
		if de.Seq == 0 {
			// A torn line may still begin with its seq: name it in the
			// error (the entry's own seq stays unknown to the fold).
			if m := leadingSeq.FindSubmatch(b); m != nil {
				de.Seq, _ = strconv.ParseUint(string(m[1]), 10, 64)
			}
		}
	}
	return Item{Seq: ev.Seq, Line: line, Event: ev, Err: err, Damaged: true}
}

func (r rawLine) body() ([]byte, string) {
	switch {
	case r.Raw != nil && r.RawBase64 != nil:
		return nil, "raw line with both raw and raw_base64"
	case r.Raw != nil:
		return []byte(*r.Raw), ""
	default:
		b, err := base64.StdEncoding.DecodeString(*r.RawBase64)
		if err != nil {
			return nil, "raw_base64: " + err.Error()
		}
		return b, ""
	}
}

// encodeRaw returns the export line of a stored record that does not
// decode, without the trailing newline.
func encodeRaw(seq uint64, body []byte, decodeErr error) []byte {
	l := rawLine{Seq: seq}
	var de *events.DecodeError
	switch {
	case errors.As(decodeErr, &de):
		// The error describes the record, not where a file held it.
		c := *de
		c.Line = 0
		l.Error = c.Error()
	case decodeErr != nil:
		l.Error = decodeErr.Error()
	}
	if utf8.Valid(body) {
		s := string(body)
		l.Raw = &s
	} else {
		s := base64.StdEncoding.EncodeToString(body)
		l.RawBase64 = &s
	}
	b, err := json.Marshal(l)
	if err != nil { // only strings and a number: cannot happen
		return fmt.Appendf(nil, `{"seq":%d,"raw_base64":%q}`, seq, base64.StdEncoding.EncodeToString(body))
	}
	return b
}
