package script

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Directive is one command of a script file with its expected output.
type Directive struct {
	// Comments are the lines written before the command, without "# ".
	Comments []string
	Cmd      string
	Args     []Arg
	// Input is the text between the command line and "----", trimmed.
	Input string
	// Output is the expected output ("" when the file has none).
	Output string
	// Line is the line of the command in the file (1-based; 0 when built).
	Line int
}

// Parse reads a script in the datadriven file format: comment lines ("#")
// and blank lines, then a command line (args key, key=val or key=(a, b); a
// trailing \ continues it), input lines up to "----", then the expected
// output up to a blank line, or, opened with a second "----", up to two
// "----" lines. Only what this package writes and the forms above are
// understood; a malformed command line is an error naming its line.
func Parse(r io.Reader) ([]Directive, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	n := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		n++
		return sc.Text(), true
	}
	var out []Directive
	var comments []string
	for {
		line, ok := next()
		if !ok {
			break
		}
		t := strings.TrimSpace(line)
		if t == "" {
			continue
		}
		if c, ok := strings.CutPrefix(t, "#"); ok {
			comments = append(comments, strings.TrimPrefix(c, " "))
			continue
		}
		d := Directive{Line: n, Comments: comments}
		comments = nil
		for strings.HasSuffix(t, `\`) {
			more, ok := next()
			if !ok {
				break
			}
			t = strings.TrimSuffix(t, `\`) + " " + strings.TrimSpace(more)
		}
		var err error
		d.Cmd, d.Args, err = parseCommand(t)
		if err != nil {
			return out, fmt.Errorf("line %d: %w", d.Line, err)
		}
		var input strings.Builder
		sep := false
		for {
			l, ok := next()
			if !ok {
				break
			}
			if l == "----" {
				sep = true
				break
			}
			input.WriteString(l + "\n")
		}
		d.Input = strings.TrimSpace(input.String())
		if sep {
			d.Output = readExpected(next)
		}
		out = append(out, d)
	}
	return out, sc.Err()
}

func readExpected(next func() (string, bool)) string {
	var b strings.Builder
	first, ok := next()
	if !ok {
		return ""
	}
	if first == "----" {
		for {
			l, ok := next()
			if !ok {
				return b.String()
			}
			if l == "----" {
				l2, ok := next()
				if !ok || l2 == "----" {
					if ok {
						next() // the blank line after the closing pair
					}
					return b.String()
				}
				b.WriteString(l + "\n" + l2 + "\n")
				continue
			}
			b.WriteString(l + "\n")
		}
	}
	for l := first; strings.TrimSpace(l) != ""; {
		b.WriteString(l + "\n")
		var ok bool
		if l, ok = next(); !ok {
			break
		}
	}
	return b.String()
}

// parseCommand parses "cmd key key=val key=(a, b)".
func parseCommand(line string) (string, []Arg, error) {
	cmd, rest := cutField(line)
	var args []Arg
	for rest != "" {
		var tok string
		if i := strings.IndexAny(rest, " =("); i < 0 || rest[i] == ' ' {
			tok, rest = cutField(rest)
			args = append(args, Arg{Key: tok})
			continue
		}
		key, val, _ := strings.Cut(rest, "=")
		if strings.ContainsAny(key, " (") {
			return "", nil, fmt.Errorf("argument %q: want key, key=val or key=(a, b)", rest)
		}
		if strings.HasPrefix(val, "(") {
			end := strings.IndexByte(val, ')')
			if end < 0 {
				return "", nil, fmt.Errorf("argument %s: missing )", key)
			}
			var vals []string
			for v := range strings.SplitSeq(val[1:end], ",") {
				vals = append(vals, strings.TrimSpace(v))
			}
			args = append(args, Arg{Key: key, Vals: vals})
			rest = strings.TrimSpace(val[end+1:])
			continue
		}
		v, after := cutField(val)
		args = append(args, Arg{Key: key, Vals: []string{v}})
		rest = after
	}
	if cmd == "" {
		return "", nil, errors.New("empty command")
	}
	return cmd, args, nil
}

var blankLine = regexp.MustCompile(`(?m)^[\t ]*\n`)

// Write writes ds in the format Parse reads and datadriven's -rewrite
// writes: comments, the command line, the input, "----", the output, a blank
// line; an output with a blank line in it goes between doubled "----"
// lines.
func Write(w io.Writer, ds []Directive) error {
	bw := bufio.NewWriter(w)
	for i, d := range ds {
		if i > 0 {
			bw.WriteString("\n")
		}
		for _, c := range d.Comments {
			if c == "" {
				bw.WriteString("#\n")
			} else {
				bw.WriteString("# " + c + "\n")
			}
		}
		bw.WriteString(d.Cmd)
		for _, a := range d.Args {
			bw.WriteString(" " + a.String())
		}
		bw.WriteString("\n")
		if d.Input != "" {
			bw.WriteString(d.Input + "\n")
		}
		bw.WriteString("----\n")
		out := d.Output
		if out != "" && !strings.HasSuffix(out, "\n") {
			out += "\n"
		}
		if blankLine.MatchString(out) {
			bw.WriteString("----\n" + out + "----\n----\n")
		} else {
			bw.WriteString(out)
		}
	}
	return bw.Flush()
}
