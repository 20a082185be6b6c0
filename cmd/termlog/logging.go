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
		return zerolog.Nop(), usage(fmt.Errorf("--log-level %q: want debug, info, warn or error", level))
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
		return zerolog.Nop(), usage(fmt.Errorf("--log-format %q: want auto, json or console", format))
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

// serverLogger is serverLog at --server-log's level (off: nothing).
func serverLogger(lg zerolog.Logger, level string) (func(level, msg string), error) {
	if level == "off" {
		return func(string, string) {}, nil
	}
	l, err := zerolog.ParseLevel(level)
	if err != nil || level == "" || l > zerolog.ErrorLevel || l < zerolog.InfoLevel {
		return nil, usage(fmt.Errorf("--server-log %q: want info, warn, error or off", level))
	}
	return serverLog(lg.Level(max(l, lg.GetLevel())).With().Str("component", "nats-server").Logger()), nil
}

// serverLog writes nats-server's log entries to lg at the matching level
// (the server's routes, JetStream elections, slow consumers: what an
// operator of a NATS node needs to see). --log-level filters them.
func serverLog(lg zerolog.Logger) func(level, msg string) {
	return func(level, msg string) {
		l := zerolog.InfoLevel
		switch level {
		case "WRN":
			l = zerolog.WarnLevel
		case "ERR", "FTL":
			l = zerolog.ErrorLevel
		case "DBG":
			l = zerolog.DebugLevel
		case "TRC":
			l = zerolog.TraceLevel
		}
		lg.WithLevel(l).Msg(msg)
	}
}
