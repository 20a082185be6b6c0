package logstore

import (
	"fmt"
	"sync"
	"sync/atomic"

	dblogger "github.com/lni/dragonboat/v4/logger"
	"github.com/rs/zerolog"
)

// Dragonboat logs through process-global loggers that write plain text to
// stderr by default ("2026-12-01 17:00:03.752374 E | transport: ..."). A
// binary whose logs are JSON lines routes them into its zerolog logger with
// LogDragonboatTo, so every line a role writes has the same format.
var (
	dbSink    atomic.Pointer[zerolog.Logger]
	dbFactory sync.Once
)

// LogDragonboatTo sends dragonboat's log lines to lg, each with
// component=dragonboat and pkg=<dragonboat's logger name>. Dragonboat binds a
// logger to its factory when the logger is first used, so call this from
// main before SetDragonboatLogLevel and before any NodeHost starts; a later
// call only changes where the lines go.
func LogDragonboatTo(lg zerolog.Logger) {
	lg = lg.With().Str("component", "dragonboat").Logger()
	dbSink.Store(&lg)
	dbFactory.Do(func() {
		dblogger.SetLoggerFactory(func(pkg string) dblogger.ILogger {
			l := &dbLog{pkg: pkg}
			l.level.Store(int32(dblogger.ERROR))
			return l
		})
	})
}

// dbLog is one dragonboat logger writing to dbSink.
type dbLog struct {
	pkg   string
	level atomic.Int32 // a dblogger.LogLevel: a line is written when its level is <= this
}

func (l *dbLog) SetLevel(lv dblogger.LogLevel) { l.level.Store(int32(lv)) }

func (l *dbLog) log(lv dblogger.LogLevel, zl zerolog.Level, format string, args []any) {
	if int32(lv) > l.level.Load() {
		return
	}
	lg := dbSink.Load()
	if lg == nil {
		return
	}
	lg.WithLevel(zl).Str("pkg", l.pkg).Msg(fmt.Sprintf(format, args...))
}

func (l *dbLog) Debugf(f string, a ...any) { l.log(dblogger.DEBUG, zerolog.DebugLevel, f, a) }
func (l *dbLog) Infof(f string, a ...any)  { l.log(dblogger.INFO, zerolog.InfoLevel, f, a) }
func (l *dbLog) Warningf(f string, a ...any) {
	l.log(dblogger.WARNING, zerolog.WarnLevel, f, a)
}
func (l *dbLog) Errorf(f string, a ...any) { l.log(dblogger.ERROR, zerolog.ErrorLevel, f, a) }

// Panicf logs at any level and panics, as dragonboat expects of it.
func (l *dbLog) Panicf(f string, a ...any) {
	msg := fmt.Sprintf(f, a...)
	if lg := dbSink.Load(); lg != nil {
		lg.WithLevel(zerolog.PanicLevel).Str("pkg", l.pkg).Msg(msg)
	}
	panic(msg)
}
