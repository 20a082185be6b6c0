package main

import (
	"fmt"
	"io"
	"os"

	"github.com/rs/zerolog"
)

// logger is the logger of --log-format and --log-level, writing to stderr.
func (g *globals) logger() (zerolog.Logger, error) {
	return newLogger(os.Stderr, g.logFormat, g.logLevel, os.Getenv("NO_COLOR") != "")
}

// newLogger writes to out: auto is console when out is a terminal and JSON
// otherwise; console has colours only at a terminal and without NO_COLOR.
func newLogger(out io.Writer, format, level string, noColor bool) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	tty := isTerminal(out)
	switch format {
	case "auto":
		format = "json"
		if tty {
			format = "console"
		}
	case "json", "console":
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: want auto, json or console", format)
	}
	var lg zerolog.Logger
	if format == "json" {
		lg = zerolog.New(out)
	} else {
		lg = zerolog.New(zerolog.ConsoleWriter{Out: out, TimeFormat: "15:04:05.000", NoColor: noColor || !tty})
	}
	return lg.Level(lvl).With().Timestamp().Logger(), nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
