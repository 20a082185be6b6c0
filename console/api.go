package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/termlog/termlog/meta/health"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/replay"
)

// Server is a console: it folds the stream and serves the pages and the
// API. Run follows the stream and probes the buckets; Handler serves.
type Server struct {
	cfg Config
	x   *index
}

// New returns a console for cfg; call Run to fill it.
func New(cfg Config) *Server {
	if cfg.ProbeEvery <= 0 {
		cfg.ProbeEvery = 250 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Server{cfg: cfg, x: newIndex()}
}

// Run follows the log and runs the probe until ctx ends; it returns once
// both have stopped.
func (s *Server) Run(ctx context.Context) error {
	if s.cfg.Log == nil {
		return fmt.Errorf("console: no log")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.x.follow(ctx, s.cfg.Log, s.cfg.Logger)
	}()
	if s.cfg.Probe != nil {
		s.probe(ctx)
	}
	<-done
	return nil
}

// probe reads the buckets every ProbeEvery until ctx ends.
func (s *Server) probe(ctx context.Context) {
	t := time.NewTicker(s.cfg.ProbeEvery)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r := s.cfg.Probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.x.setRead(r)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Handler serves the pages (/) and the API (/api/v1/).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", assetHandler()))
	mux.HandleFunc("GET /{$}", s.page)
	mux.HandleFunc("GET /api/v1/status", s.apiStatus)
	mux.HandleFunc("GET /api/v1/workers", s.apiWorkers)
	mux.HandleFunc("GET /api/v1/shards", s.apiShards)
	mux.HandleFunc("GET /api/v1/stores", s.apiStores)
	mux.HandleFunc("GET /api/v1/events", s.apiEvents)
	mux.HandleFunc("GET /api/v1/events/{seq}", s.apiEvent)
	mux.HandleFunc("GET /api/v1/state", s.apiState)
	mux.HandleFunc("GET /api/v1/timeline", s.apiTimeline)
	mux.HandleFunc("GET /api/v1/watch", s.apiWatch)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "the console is read-only", http.StatusMethodNotAllowed)
			return
		}
		http.NotFound(w, r)
	})
	return readOnly(mux)
}

// readOnly refuses every method but GET and HEAD: nothing on the console
// writes.
func readOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "the console is read-only", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:")
		h.ServeHTTP(w, r)
	})
}

func (s *Server) page(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(indexHTML)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func badRequest(w http.ResponseWriter, format string, a ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf(format, a...)})
}

// Status is GET /api/v1/status: the Status `termlog status -o json`
// prints, plus the console's own reading of the stream. With brief=1 the
// workers and anomalies lists are left out (the overview's poll).
type Status struct {
	health.Status
	// Exit is the exit status `termlog status` would end with: 0 healthy,
	// 1 degraded.
	Exit int `json:"exit"`
	// StreamError is why the console cannot read the stream now ("" while
	// it follows it).
	StreamError string `json:"stream_error,omitempty"`
	// Probed is false until the lease and health buckets were read once.
	Probed bool `json:"probed"`
	// WorkerStates counts the workers by state.
	WorkerStates map[string]int `json:"worker_states"`
	// TermSince is when the current term started (the time its leader
	// wrote in term.started), TermAgeMS how long ago.
	TermSince time.Time `json:"term_since,omitzero"`
	TermAgeMS int64     `json:"term_age_ms,omitempty"`
	// Banners is the overview's red banner, one entry a fault (banners).
	Banners []Banner `json:"banners"`
	// Version changes whenever anything the console shows does.
	Version uint64 `json:"version"`
}

func (s *Server) status() Status {
	st := s.x.status(s.cfg.Cluster, s.cfg.Now())
	out := Status{Status: st, WorkerStates: map[string]int{}}
	if !st.Health.Healthy {
		out.Exit = 1
	}
	for _, w := range st.Workers {
		out.WorkerStates[w.State]++
	}
	out.Banners = banners(st.LeaseHolder, st.LeaseError, st.Health.Record)
	s.x.mu.RLock()
	out.StreamError, out.Probed, out.Version = errText(s.x.err), s.x.probed || s.cfg.Probe == nil, s.x.version
	if out.TermSince = s.x.termSince; !out.TermSince.IsZero() {
		out.TermAgeMS = max(s.cfg.Now().Sub(out.TermSince), 0).Milliseconds()
	}
	s.x.mu.RUnlock()
	return out
}

func (s *Server) apiStatus(w http.ResponseWriter, r *http.Request) {
	st := s.status()
	if r.URL.Query().Get("brief") == "1" {
		st.Workers, st.Anomalies = nil, nil
	}
	writeJSON(w, st)
}

// Workers is GET /api/v1/workers: one page of the projected workers.
type Workers struct {
	Total   int                  `json:"total"`   // workers in the projection
	Matched int                  `json:"matched"` // matching the filter
	Offset  int                  `json:"offset"`
	Limit   int                  `json:"limit"`
	Seq     uint64               `json:"seq"` // the projection's seq
	Workers []projections.Worker `json:"workers"`
}

func intParam(r *http.Request, name string, def, lo, hi int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s=%q: want a number from %d to %d", name, v, lo, hi)
	}
	return n, nil
}

func uintParam(r *http.Request, name string) (uint64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s=%q: want a number", name, v)
	}
	return n, nil
}

// apiWorkers pages the workers in id order, filtered by state and by a
// substring of the endpoint, kind or incarnation (q), without listing the
// ones outside the page.
func (s *Server) apiWorkers(w http.ResponseWriter, r *http.Request) {
	offset, err := intParam(r, "offset", 0, 0, 1<<31-1)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	limit, err := intParam(r, "limit", 100, 1, 1000)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	state, q := r.URL.Query().Get("state"), r.URL.Query().Get("q")
	out := Workers{Offset: offset, Limit: limit, Workers: []projections.Worker{}}
	s.x.mu.RLock()
	st := s.x.folder.State()
	out.Total, out.Seq = len(st.Workers), st.Seq
	ids := make([]uint64, 0, len(st.Workers))
	for id, wk := range st.Workers {
		if state != "" && wk.State != state {
			continue
		}
		if q != "" && !strings.Contains(wk.Endpoint, q) && !strings.Contains(wk.Kind, q) && !strings.Contains(wk.Incarnation, q) && strconv.FormatUint(wk.ID, 10) != q {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out.Matched = len(ids)
	for i := offset; i < len(ids) && i < offset+limit; i++ {
		out.Workers = append(out.Workers, *st.Workers[ids[i]])
	}
	s.x.mu.RUnlock()
	writeJSON(w, out)
}

// Shards is GET /api/v1/shards: the projected shards (as in `status -o
// json`) and the leader's published health of each, with its age.
type Shards struct {
	Seq    uint64              `json:"seq"`
	Shards []projections.Shard `json:"shards"`
	Health any                 `json:"health"` // the record's shards ([]sched.ShardHealth), null: none
	AgeMS  int64               `json:"age_ms"`
	// Collecting are the stores the leader has not heard from yet this
	// term: whether their replicas run is not known yet.
	Collecting []string `json:"collecting,omitempty"`
	// Problems are the judge's, as on the overview.
	Problems []string `json:"problems"`
}

func (s *Server) apiShards(w http.ResponseWriter, _ *http.Request) {
	st := s.status()
	out := Shards{Seq: st.Seq, Shards: st.Shards, AgeMS: st.Health.AgeMS, Problems: st.Health.Problems}
	if rec := st.Health.Record; rec != nil {
		out.Health, out.Collecting = rec.Shards, rec.Collecting
	}
	writeJSON(w, out)
}

// Stores is GET /api/v1/stores: the projected stores and their published
// health.
type Stores struct {
	Seq    uint64              `json:"seq"`
	Stores []projections.Store `json:"stores"`
	Health any                 `json:"health"` // the record's stores ([]sched.StoreHealth), null: none
	AgeMS  int64               `json:"age_ms"`
	At     *time.Time          `json:"record_at,omitempty"`
}

func (s *Server) apiStores(w http.ResponseWriter, _ *http.Request) {
	st := s.status()
	out := Stores{Seq: st.Seq, Stores: st.Stores, AgeMS: st.Health.AgeMS}
	if rec := st.Health.Record; rec != nil {
		out.Health, out.At = rec.Stores, &rec.At
	}
	writeJSON(w, out)
}

// EventFilter selects events: replay's timeline filter plus the term, the
// writer and the outcome.
type EventFilter struct {
	replay.Filter
	Term    uint64
	Writer  string
	Outcome string // "applied", "noop", "rejected", "corrupt", or with the kind: "rejected stale-term"
}

// Match reports whether the row (its step) matches.
func (f EventFilter) match(st replay.Step, row Row) bool {
	if f.Term != 0 && row.Term != f.Term || f.Writer != "" && row.Writer != f.Writer {
		return false
	}
	if f.Outcome != "" && row.Outcome != f.Outcome && row.OutcomeText != f.Outcome {
		return false
	}
	return f.Filter.Match(st)
}

func parseFilter(r *http.Request) (EventFilter, error) {
	q := r.URL.Query()
	var f EventFilter
	var err error
	if f.Worker, err = uintParam(r, "worker"); err != nil {
		return f, err
	}
	if f.Shard, err = uintParam(r, "shard"); err != nil {
		return f, err
	}
	if f.Term, err = uintParam(r, "term"); err != nil {
		return f, err
	}
	f.Type, f.Writer, f.Store, f.Endpoint = q.Get("type"), q.Get("writer"), q.Get("store"), q.Get("endpoint")
	f.Outcome = q.Get("outcome")
	switch strings.Fields(f.Outcome + " x")[0] {
	case "applied", "noop", "rejected", "corrupt", "x":
	default:
		return f, fmt.Errorf("outcome=%q: want applied, noop, rejected or corrupt", f.Outcome)
	}
	return f, nil
}

// Events is GET /api/v1/events: a page of rows, oldest first from seq
// from (or newest first before seq before, with order=desc).
type Events struct {
	Tail   uint64 `json:"tail"` // the last seq folded
	Events []Row  `json:"events"`
	// Next is the from (or before, with order=desc) of the next page; 0: none.
	Next uint64 `json:"next"`
}

func (s *Server) apiEvents(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	from, err := uintParam(r, "from")
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	before, err := uintParam(r, "before")
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	limit, err := intParam(r, "limit", 100, 1, 5000)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	desc := r.URL.Query().Get("order") == "desc"
	out := Events{Events: []Row{}}
	s.x.mu.RLock()
	out.Tail = s.x.folder.State().Seq
	rows := s.x.rows
	// rows[i] is the entry at seq i+1 for a stream (seqs 1, 2, 3...); a
	// search finds the start either way.
	step := func(i int) replay.Step {
		it := s.x.items[i]
		res := projections.Result{Kind: rows[i].Kind, Reason: rows[i].Reason}
		return replay.Step{Item: it, Result: res, Touch: touchOf(rows[i])}
	}
	if !desc {
		i, _ := slices.BinarySearchFunc(rows, max(from, 1), func(r Row, seq uint64) int { return cmpSeq(r.Seq, seq) })
		for ; i < len(rows); i++ {
			if f.match(step(i), rows[i]) {
				if len(out.Events) == limit {
					out.Next = rows[i].Seq
					break
				}
				out.Events = append(out.Events, rows[i])
			}
		}
	} else {
		if before == 0 {
			before = out.Tail + 1
		}
		i, _ := slices.BinarySearchFunc(rows, before, func(r Row, seq uint64) int { return cmpSeq(r.Seq, seq) })
		for i--; i >= 0; i-- {
			if f.match(step(i), rows[i]) {
				if len(out.Events) == limit {
					out.Next = rows[i].Seq + 1
					break
				}
				out.Events = append(out.Events, rows[i])
			}
		}
	}
	s.x.mu.RUnlock()
	writeJSON(w, out)
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// touchOf is the row's touch as replay's Touch, for replay's filter.
func touchOf(r Row) replay.Touch {
	if r.Touch == nil {
		return replay.Touch{}
	}
	return replay.Touch{Workers: r.Touch.Workers, Endpoints: r.Touch.Endpoints, Stores: r.Touch.Stores, Shards: r.Touch.Shards}
}

func (s *Server) apiEvent(w http.ResponseWriter, r *http.Request) {
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil {
		badRequest(w, "seq %q: want a number", r.PathValue("seq"))
		return
	}
	s.x.mu.RLock()
	rows := s.x.rows
	i, ok := slices.BinarySearchFunc(rows, seq, func(r Row, seq uint64) int { return cmpSeq(r.Seq, seq) })
	var row Row
	if ok {
		row = rows[i]
	}
	s.x.mu.RUnlock()
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": fmt.Sprintf("no event at seq %d", seq)})
		return
	}
	writeJSON(w, row)
}

// apiState is the projected state after seq (time travel), the document
// `replay --until-seq N --json` prints.
func (s *Server) apiState(w http.ResponseWriter, r *http.Request) {
	seq, err := uintParam(r, "seq")
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	if seq == 0 {
		s.x.mu.RLock()
		seq = s.x.folder.State().Seq
		s.x.mu.RUnlock()
	}
	writeJSON(w, replay.StateJSON(s.x.stateAt(seq)))
}

func (s *Server) apiTimeline(w http.ResponseWriter, _ *http.Request) {
	s.x.mu.RLock()
	tl := buildTimeline(s.x.rows)
	s.x.mu.RUnlock()
	writeJSON(w, tl)
}

// apiWatch is a server-sent event stream: one "change" event (its data the
// version, seq and term) whenever what the console shows changed, at most
// every 100ms, and a comment every 15s to keep the connection open.
func (s *Server) apiWatch(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	ctx := r.Context()
	var last uint64
	keep := time.NewTicker(15 * time.Second)
	defer keep.Stop()
	for {
		ch, v := s.x.watch()
		if v != last {
			last = v
			s.x.mu.RLock()
			st := s.x.folder.State()
			seq, term, leader := st.Seq, st.Term, st.Leader
			s.x.mu.RUnlock()
			b, _ := json.Marshal(map[string]any{"version": v, "seq": seq, "term": term, "leader": leader})
			if _, err := fmt.Fprintf(w, "event: change\ndata: %s\n\n", b); err != nil {
				return
			}
			fl.Flush()
		}
		select {
		case <-ctx.Done():
			return
		case <-keep.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			fl.Flush()
		case <-ch:
			select { // gather a burst into one event
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}
