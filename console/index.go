// Package console is termlog's web console and its one-file HTML report.
//
// The console folds the event stream with replay's Folder (so every row
// carries the outcome and reason replay prints), judges health with
// meta/health (the judge `status` uses), and serves both as a read-only
// JSON API under /api/v1/ and as pages embedded in the binary that read
// only that API. Nothing here writes to the cluster.
package console

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/health"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/replay"
)

// Probe reads the lease and health buckets (the parts of a Status that are
// not in the stream). It is called every Config.ProbeEvery.
type Probe func(ctx context.Context) health.Read

// Config is what a console shows and how.
type Config struct {
	// Cluster is the cluster's name, as status prints it.
	Cluster string
	// Log is the live stream the console follows.
	Log events.Log
	// Probe reads the lease and health buckets; nil: none (a replayed
	// file has no buckets, and its status says so).
	Probe Probe
	// ProbeEvery is how often Probe runs (default 250ms).
	ProbeEvery time.Duration
	// Logger gets the console's own problems.
	Logger zerolog.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Row is one event as the console and the report show it: the entry
// `replay --json` prints, plus the outcome and the data as replay's
// timeline prints them.
type Row struct {
	replay.StepJSON
	// OutcomeText is replay's outcome column ("rejected stale-term").
	OutcomeText string `json:"outcome_text"`
	// Summary is replay's data column.
	Summary string `json:"summary"`
}

// rowOf renders one folded step with replay's renderer.
func rowOf(st replay.Step) Row {
	return Row{StepJSON: replay.ToJSON(st), OutcomeText: replay.Outcome(st.Result), Summary: replay.Summary(st.Item)}
}

// index is the console's fold of the log: every row, every entry (for the
// state at a seq) and the state at the end. Run's goroutine is its only
// writer; handlers read under mu.
type index struct {
	mu      sync.RWMutex
	folder  *replay.Folder
	items   []replay.Item
	rows    []Row
	read    health.Read
	probed  bool
	version uint64
	err     error // the follower's last error (nil while it follows)
	changed chan struct{}
	// termSince is when the current term started (its term.started's time).
	termSince time.Time

	// cached status: built at (seq, version) at cachedAt
	cached   *health.Status
	cacheKey [2]uint64
	cachedAt time.Time
}

func newIndex() *index {
	return &index{folder: replay.NewFolder(), changed: make(chan struct{})}
}

// bump marks a change and wakes every watcher. Call with mu held.
func (x *index) bump() {
	x.version++
	close(x.changed)
	x.changed = make(chan struct{})
}

// add folds one entry.
func (x *index) add(it replay.Item) {
	x.mu.Lock()
	defer x.mu.Unlock()
	st := x.folder.Fold(it)
	it.Body = nil // the decoded event is enough to fold it again
	x.items = append(x.items, it)
	row := rowOf(st)
	x.rows = append(x.rows, row)
	if row.Type == events.TypeTermStarted && st.Result.Outcome == projections.Applied {
		x.termSince = row.At
	}
	x.bump()
}

// setRead records what the probe read; a change wakes the watchers.
func (x *index) setRead(r health.Read) {
	x.mu.Lock()
	defer x.mu.Unlock()
	same := x.probed && r.Holder == x.read.Holder && errText(r.LeaseErr) == errText(x.read.LeaseErr) && r.TTL == x.read.TTL && sameRecord(r, x.read)
	x.read, x.probed = r, true
	if !same {
		x.bump()
	}
}

func sameRecord(a, b health.Read) bool {
	if a.Record == nil || b.Record == nil {
		return a.Record == b.Record
	}
	return a.Record.At.Equal(b.Record.At) && a.Record.Term == b.Record.Term && a.Record.Seq == b.Record.Seq
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (x *index) setErr(err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if errText(err) != errText(x.err) {
		x.err = err
		x.bump()
	}
}

// watch returns the channel closed at the next change and the version now.
func (x *index) watch() (<-chan struct{}, uint64) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.changed, x.version
}

// status is the judged status now: health.Assemble over the fold and the
// probe's read, cached while neither changed for up to 250ms (the record's
// age moves by itself).
func (x *index) status(cluster string, now time.Time) health.Status {
	x.mu.RLock()
	key := [2]uint64{x.folder.State().Seq, x.version}
	if x.cached != nil && x.cacheKey == key && now.Sub(x.cachedAt) < 250*time.Millisecond {
		s := *x.cached
		x.mu.RUnlock()
		return s
	}
	s := health.Assemble(cluster, x.folder.State(), nil, x.read, now)
	x.mu.RUnlock()
	x.mu.Lock()
	x.cached, x.cacheKey, x.cachedAt = &s, key, now
	x.mu.Unlock()
	return s
}

// stateAt folds the entries up to seq again: the state at that seq, as
// `replay --until-seq` prints it.
func (x *index) stateAt(seq uint64) *projections.State {
	x.mu.RLock()
	n := len(x.items)
	for n > 0 && x.items[n-1].Seq > seq {
		n--
	}
	items := x.items[:n:n]
	x.mu.RUnlock()
	f := replay.NewFolder()
	for _, it := range items {
		if it.Seq > seq {
			break
		}
		f.Fold(it)
	}
	return f.State()
}

// follow folds the live log into x until ctx ends, waiting for new
// events; a failed read is retried after the last seq folded.
func (x *index) follow(ctx context.Context, l events.Log, lg zerolog.Logger) {
	for {
		x.mu.RLock()
		from := x.folder.State().Seq + 1
		x.mu.RUnlock()
		err := l.Watch(ctx, from, func(r events.Record) error {
			x.add(replay.RecordItem(r.Seq, r.Data))
			x.setErr(nil)
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		lg.Warn().Err(err).Msg("console: reading the stream; retrying in 1s")
		x.setErr(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// load folds a fixed source (a JSONL export) into x once.
func (x *index) load(ctx context.Context, src replay.Source) error {
	return src.Read(ctx, func(it replay.Item) error {
		if it.Damaged {
			return errors.New("corrupt line: " + it.Err.Error())
		}
		x.add(it)
		return nil
	})
}

// seq is the last seq folded.
func (x *index) seq() uint64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.folder.State().Seq
}
