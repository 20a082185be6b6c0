// Package script is the pure core of projtest: the grammar of an event line,
// the commands of a projection script run against a projections.State, and a
// reader and writer of the datadriven file format. It imports events and
// projections only (no testing, no I/O but the io.Reader and io.Writer it is
// handed), so replay can write a script and read one back without a test
// framework. The grammar is documented in package projtest.
package script

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/termlog/termlog/events"
)

// Base is the time of seq 0 in scripts: an event line without at= happens
// at Base() + seq seconds.
func Base() time.Time { return time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC) }

// Entry is one line of an apply block: an event, or a body stored as is.
type Entry struct {
	// Seq is the seq the line names with seq=; 0 is the next seq (the
	// state's seq + 1).
	Seq uint64
	// At is the time the line names with at=; zero is Base() + seq seconds.
	At time.Time
	// AtText is at= as written: the body holds it as it is, so a line
	// keeps the time of the incident byte for byte (offset, precision).
	AtText string
	// Raw is the body of a raw or raw64 line; nil for an event line.
	Raw []byte

	Term   uint64
	Writer string
	Type   string
	Data   json.RawMessage
}

// ParseEntry parses one line of an apply block:
//
//	[seq=<n>] [at=<RFC3339>] <term> <writer> <type> <json data>
//	[seq=<n>] raw <body>
//	[seq=<n>] raw64 <standard base64 of the body>
//
// The writer is a bare word, or a Go-quoted string when it is empty or holds
// spaces or quotes.
func ParseEntry(line string) (Entry, error) {
	var e Entry
	rest := strings.TrimSpace(line)
	for {
		tok, after := cutField(rest)
		key, val, ok := strings.Cut(tok, "=")
		if !ok || (key != "seq" && key != "at") {
			break
		}
		switch key {
		case "seq":
			n, err := strconv.ParseUint(val, 10, 64)
			if err != nil || n == 0 {
				return e, fmt.Errorf("seq=%q: want a positive integer", val)
			}
			e.Seq = n
		case "at":
			t, err := time.Parse(time.RFC3339Nano, val)
			if err != nil {
				return e, fmt.Errorf("at=%q: want an RFC3339 time such as 2026-11-30T03:00:01Z", val)
			}
			e.At, e.AtText = t.UTC(), val
		}
		rest = after
	}
	if body, ok := cutKeyword(rest, "raw"); ok {
		e.Raw = []byte(body)
		return e, nil
	}
	if body, ok := cutKeyword(rest, "raw64"); ok {
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			return e, fmt.Errorf("raw64: %v", err)
		}
		e.Raw = b
		return e, nil
	}
	termTok, rest := cutField(rest)
	term, err := strconv.ParseUint(termTok, 10, 64)
	if err != nil {
		return e, fmt.Errorf("want [seq=N] [at=T] <term> <writer> <type> <json>, raw <body> or raw64 <base64>; term %q is not a number", termTok)
	}
	e.Term = term
	if strings.HasPrefix(rest, `"`) {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return e, fmt.Errorf("writer %s: %v", rest, err)
		}
		e.Writer, _ = strconv.Unquote(q)
		rest = strings.TrimLeftFunc(rest[len(q):], unicode.IsSpace)
	} else {
		e.Writer, rest = cutField(rest)
	}
	e.Type, rest = cutField(rest)
	if err := missing(e.Writer, e.Type, rest); err != nil {
		return e, err
	}
	if !json.Valid([]byte(rest)) {
		return e, fmt.Errorf("data %s: not valid JSON", rest)
	}
	e.Data = json.RawMessage(rest)
	return e, nil
}

const eventLine = "<term> <writer> <type> <json data>"

// missing names what an event line lacks, from the fields it read as the
// writer, the type and the data.
func missing(writer, typ, data string) error {
	switch {
	case writer == "" && typ == "":
		return fmt.Errorf("missing the writer, the type and the data: want %s", eventLine)
	case typ == "":
		return fmt.Errorf("missing the type and the data after writer %s: want %s", writer, eventLine)
	case data == "" && strings.HasPrefix(typ, "{"):
		// The JSON stands where the type goes: one field is missing.
		if slices.Contains(events.Types(), writer) {
			return fmt.Errorf("missing the writer: %s is the type, and the writer (the replica that appended it, such as meta-1) comes before it: want %s", writer, eventLine)
		}
		return fmt.Errorf("missing the type after writer %s (one of %s): want %s", writer, strings.Join(events.Types(), ", "), eventLine)
	case data == "":
		return fmt.Errorf("missing the data of %s (a JSON object such as {\"id\":1}): want %s", typ, eventLine)
	}
	return nil
}

// cutField splits off the first space-separated field.
func cutField(s string) (field, rest string) {
	s = strings.TrimLeftFunc(s, unicode.IsSpace)
	i := strings.IndexFunc(s, unicode.IsSpace)
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimLeftFunc(s[i:], unicode.IsSpace)
}

// cutKeyword reports whether s is kw alone or kw followed by a space, and
// returns what follows (one space taken off).
func cutKeyword(s, kw string) (string, bool) {
	if s == kw {
		return "", true
	}
	if after, ok := strings.CutPrefix(s, kw+" "); ok {
		return after, true
	}
	return "", false
}

// Body is the stored body the entry stands for, at seq.
func (e Entry) Body(seq uint64) []byte {
	if e.Raw != nil {
		return e.Raw
	}
	at := e.At
	if at.IsZero() {
		at = Base().Add(time.Duration(seq) * time.Second)
	}
	atJSON, _ := json.Marshal(at)
	if e.AtText != "" {
		atJSON, _ = json.Marshal(e.AtText)
	}
	// The envelope of events.Encode, its at as written.
	env := events.EnvelopeOf[json.RawMessage]{V: events.Version, Term: e.Term, Writer: e.Writer, At: atJSON, Type: e.Type, Data: e.Data}
	b, err := json.Marshal(env)
	if err != nil { // Data was checked to be valid JSON
		return fmt.Appendf(nil, "unencodable script line: %v", err)
	}
	return b
}

// FormatEvent is the script line of ev. last is the highest seq before it:
// seq= is left out when ev.Seq is last+1, and at= when ev.At is Base() + seq
// seconds, so a script converted from a hand-written one reads like it.
func FormatEvent(ev events.Event, last uint64) (string, error) {
	if ev.Data == nil {
		return "", errors.New("event without payload")
	}
	data, err := json.Marshal(ev.Data)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", ev.Type(), err)
	}
	var b strings.Builder
	b.WriteString(prefix(ev.Seq, last))
	if at := ev.At.UTC(); !at.Equal(Base().Add(time.Duration(ev.Seq) * time.Second)) {
		fmt.Fprintf(&b, "at=%s ", at.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(&b, "%d %s %s %s", ev.Term, formatWriter(ev.Writer), ev.Type(), data)
	return b.String(), nil
}

// FormatOriginal is the script line of ev that keeps its stored bytes: at
// is the envelope's "at" text and data its "data" JSON, both as they were
// written (an "epoch":0 a writer left in stays, a field it left out stays
// out, a time keeps its offset and precision). It returns an error when the
// line would not read back: data of several lines, a field this build does
// not know (FormatEvent re-encodes such an event).
func FormatOriginal(ev events.Event, last uint64, at string, data []byte) (string, error) {
	if ev.Data == nil {
		return "", errors.New("event without payload")
	}
	if bytes.ContainsAny(data, "\r\n") {
		return "", errors.New("data of several lines")
	}
	var b strings.Builder
	b.WriteString(prefix(ev.Seq, last))
	if base, _ := json.Marshal(Base().Add(time.Duration(ev.Seq) * time.Second)); string(base) != strconv.Quote(at) {
		fmt.Fprintf(&b, "at=%s ", at)
	}
	fmt.Fprintf(&b, "%d %s %s %s", ev.Term, formatWriter(ev.Writer), ev.Type(), data)
	line := b.String()
	e, err := ParseEntry(line)
	if err == nil {
		err = e.checkFields()
	}
	if err != nil {
		return "", err
	}
	return line, nil
}

// FormatRaw is the script line of a body stored as is at seq: raw when the
// body reads back unchanged from a line, raw64 otherwise.
func FormatRaw(seq, last uint64, body []byte) string {
	p := prefix(seq, last)
	s := string(body)
	if len(body) > 0 && utf8.Valid(body) && !strings.ContainsAny(s, "\r\n") && strings.TrimSpace(s) == s {
		return p + "raw " + s
	}
	return p + "raw64 " + base64.StdEncoding.EncodeToString(body)
}

func prefix(seq, last uint64) string {
	if seq == 0 || seq == last+1 {
		return ""
	}
	return fmt.Sprintf("seq=%d ", seq)
}

func formatWriter(w string) string {
	if w == "" || strings.ContainsFunc(w, func(r rune) bool { return unicode.IsSpace(r) || r == '"' || !unicode.IsPrint(r) }) {
		return strconv.Quote(w)
	}
	return w
}

// checkFields refuses a data field the event's kind does not have (a typo
// such as "epoc", or "colour"), naming the fields it has: the live fold
// ignores unknown fields, so a script would test something else than it
// says. A kind this build does not know is left to the fold (corrupt).
func (e Entry) checkFields() error {
	if e.Raw != nil {
		return nil
	}
	ev, err := events.Decode(1, e.Body(1))
	if err != nil || ev.Data == nil {
		return nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(e.Data, &fields) != nil {
		return nil
	}
	known := PayloadFields(ev.Data)
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(known, k) {
			return fmt.Errorf("%s has no field %q (its fields: %s; go doc ./events %s)", e.Type, k, strings.Join(known, ", "), reflect.TypeOf(ev.Data).Name())
		}
	}
	return nil
}

// PayloadFields lists the JSON fields of an event kind's data, in the
// order of its Go type.
func PayloadFields(p events.Payload) []string {
	t := reflect.TypeOf(p)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}
