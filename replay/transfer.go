package replay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/termlog/termlog/events"
)

// RawAppender is a Log that can also store a body as is, fenced like
// events.Log.Append (the log's last seq must be expectedLast), so an import
// keeps the corrupt records of an export. It returns the body's seq.
type RawAppender interface {
	AppendRaw(ctx context.Context, expectedLast uint64, body []byte) (uint64, error)
}

// ErrNotEmpty is returned by Import into a log that already holds events.
var ErrNotEmpty = errors.New("log is not empty")

// TransferOptions tune Export and Import. The zero value is usable.
type TransferOptions struct {
	// Diag receives progress of long transfers; nil discards it.
	Diag io.Writer
	// Now is the clock for progress reports; nil is time.Now.
	Now func() time.Time
}

// Stats count what a transfer moved.
type Stats struct {
	Events uint64 `json:"events"` // entries, raw ones included
	Raw    uint64 `json:"raw"`    // raw lines: records kept byte for byte
	First  uint64 `json:"first"`  // first seq (0 when none)
	Last   uint64 `json:"last"`   // last seq (0 when none)
}

func (s *Stats) add(seq uint64, raw bool) {
	if s.Events == 0 {
		s.First = seq
	}
	s.Events++
	s.Last = seq
	if raw {
		s.Raw++
	}
}

// Export writes every entry of src to w as JSONL: events with
// events.WriteJSONL, stored records that do not decode as raw lines (see the
// package documentation). A damaged line of a JSONL source is an error: it
// has no body to keep.
func Export(ctx context.Context, src Source, w io.Writer, o TransferOptions) (Stats, error) {
	bw := bufio.NewWriter(w)
	prog := newProgress(o.Diag, o.Now, "export")
	var st Stats
	err := src.Read(ctx, func(it Item) error {
		switch {
		case it.Damaged:
			return fmt.Errorf("export: %w", it.Err)
		case it.Err != nil:
			b := append(encodeRaw(it.Seq, it.Body, it.Err), '\n')
			if _, err := bw.Write(b); err != nil {
				return fmt.Errorf("export seq %d: %w", it.Seq, err)
			}
		default:
			if err := events.WriteJSONL(bw, it.Event); err != nil {
				return fmt.Errorf("export seq %d: %w", it.Seq, err)
			}
		}
		st.add(it.Seq, it.Err != nil)
		prog.tick(st.Events, it.Seq)
		return nil
	})
	if ferr := bw.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("export: %w", ferr)
	}
	prog.done(st.Events, st.Last)
	return st, err
}

// Import appends every entry of the JSONL export r to l, which must be empty
// (else ErrNotEmpty), so that each entry gets the seq it has in the file.
// It reads r twice: first it checks the whole file — every line an event or a
// raw line, seqs 1, 2, 3, ... without gaps — and refuses it naming the first
// bad line, leaving l untouched; then it appends entry by entry with the
// CAS on the previous seq. Raw lines need l to be a RawAppender.
func Import(ctx context.Context, r io.ReadSeeker, l events.Log, o TransferOptions) (Stats, error) {
	tail, err := l.Tail(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("import: %w", err)
	}
	if tail != 0 {
		return Stats{}, fmt.Errorf("import: %w: its last seq is %d; import needs a fresh, empty stream", ErrNotEmpty, tail)
	}
	raw, canRaw := l.(RawAppender)
	start, err := r.Seek(0, io.SeekCurrent)
	if err != nil {
		return Stats{}, fmt.Errorf("import: %w", err)
	}
	// Pass 1: check.
	var want Stats
	err = JSONL(r).Read(ctx, func(it Item) error {
		if err := importable(it, want.Last+1, canRaw); err != nil {
			return err
		}
		want.add(it.Seq, it.Body != nil)
		return nil
	})
	if err != nil {
		return Stats{}, fmt.Errorf("import refused, nothing appended: %w", err)
	}
	if _, err := r.Seek(start, io.SeekStart); err != nil {
		return Stats{}, fmt.Errorf("import: %w", err)
	}
	// Pass 2: append.
	prog := newProgress(o.Diag, o.Now, "import")
	var got Stats
	err = JSONL(r).Read(ctx, func(it Item) error {
		// The file may have changed since pass 1.
		if err := importable(it, got.Last+1, canRaw); err != nil {
			return err
		}
		var err error
		if it.Body != nil {
			_, err = raw.AppendRaw(ctx, it.Seq-1, it.Body)
		} else {
			_, err = l.Append(ctx, it.Seq-1, it.Event)
		}
		if err != nil {
			return fmt.Errorf("line %d: append seq %d: %w", it.Line, it.Seq, err)
		}
		got.add(it.Seq, it.Body != nil)
		prog.tick(got.Events, it.Seq)
		return nil
	})
	prog.done(got.Events, got.Last)
	if err != nil {
		return got, fmt.Errorf("import stopped after %d events: %w", got.Events, err)
	}
	if got != want {
		return got, fmt.Errorf("import: the file changed while importing: checked %d events up to seq %d, appended %d up to seq %d",
			want.Events, want.Last, got.Events, got.Last)
	}
	return got, nil
}

// importable checks that it can be appended as seq want.
func importable(it Item, want uint64, canRaw bool) error {
	switch {
	case it.Damaged:
		return fmt.Errorf("%w (a damaged line cannot be imported; a corrupt record is kept as a raw line)", it.Err)
	case it.Seq < want:
		return fmt.Errorf("line %d: seq %d out of order: want seq %d", it.Line, it.Seq, want)
	case it.Seq != want:
		return fmt.Errorf("line %d: seq %d leaves a gap: want seq %d", it.Line, it.Seq, want)
	case it.Body != nil && !canRaw:
		return fmt.Errorf("line %d: seq %d is a raw record and this log cannot store raw bodies", it.Line, it.Seq)
	}
	return nil
}
