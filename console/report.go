package console

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"time"

	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/replay"
)

// ReportOptions say what a report holds.
type ReportOptions struct {
	// Title names the source ("events.jsonl", "stream TERMLOG_TERMLOG").
	Title string
	// Filter chooses the rows of the event table (replay's timeline
	// filter); the timeline, the rejections and the state see every event.
	Filter replay.Filter
	// UntilSeq and UntilTime end the fold (as replay's).
	UntilSeq  uint64
	UntilTime time.Time
	// History lists the ids whose stories the report tells.
	History []replay.Subject
	// SkipCorrupt folds a damaged JSONL line as a corrupt event.
	SkipCorrupt bool
	// Now stamps the report (nil: time.Now).
	Now func() time.Time
}

// reportData is the report's embedded document (gzip, base64).
type reportData struct {
	Title     string    `json:"title"`
	Generated time.Time `json:"generated"`
	Events    int       `json:"events"` // entries folded
	Shown     int       `json:"shown"`  // rows in the table (the filter's)
	Filter    string    `json:"filter,omitempty"`
	// Packed are the rows of the table, the rejected rows and each
	// history's rows, as packRows packs them.
	Packed    packedRows           `json:"packed"`
	Timeline  Timeline             `json:"timeline"`
	State     any                  `json:"state"`
	Histories []reportHistory      `json:"histories"`
	Counters  projections.Counters `json:"counters"`
}

type reportHistory struct {
	Subject string `json:"subject"`
	Index   []int  `json:"index"` // its rows: indexes into Packed.Rows
}

// packedRows are rows as arrays (a 100,000-event report stays small and
// quick to parse): each row is [seq, ms after Base (-1: no time), term,
// writer, type, outcome, kind, outcome text (indexes into Dict), reason,
// summary]; report.js unpacks them into the rows the API serves.
type packedRows struct {
	Base     time.Time `json:"base"`
	Dict     []string  `json:"dict"`
	Rows     [][]any   `json:"rows"`     // every row folded
	Table    []int     `json:"table"`    // the rows of the table (the filter's): indexes into Rows
	Rejected []int     `json:"rejected"` // the rejected and corrupt rows
}

type packer struct {
	p    packedRows
	dict map[string]int
}

func (k *packer) str(s string) int {
	i, ok := k.dict[s]
	if !ok {
		i = len(k.p.Dict)
		k.dict[s] = i
		k.p.Dict = append(k.p.Dict, s)
	}
	return i
}

// add packs a row and returns its index.
func (k *packer) add(r Row) int {
	if k.p.Base.IsZero() && !r.At.IsZero() {
		k.p.Base = r.At
	}
	ms := int64(-1)
	if !r.At.IsZero() {
		ms = r.At.Sub(k.p.Base).Milliseconds()
	}
	k.p.Rows = append(k.p.Rows, []any{r.Seq, ms, r.Term, k.str(r.Writer), k.str(r.Type), k.str(r.Outcome), k.str(r.Kind), k.str(r.OutcomeText), r.Reason, r.Summary})
	return len(k.p.Rows) - 1
}

// Report folds src and writes one self-contained HTML file to w: the
// timeline, the event table with outcomes, the rejections, the final state
// and the chosen histories, rendered by the console's own code (render.js)
// from data embedded in the file. It needs no network to open.
func Report(ctx context.Context, src replay.Source, o ReportOptions, w io.Writer) error {
	if src == nil {
		return errors.New("report: no source")
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	f := replay.NewFolder()
	d := reportData{Title: o.Title, Generated: now().UTC(), Histories: []reportHistory{}}
	if o.Filter != (replay.Filter{}) {
		d.Filter = fmt.Sprintf("%+v", o.Filter)
	}
	for _, s := range o.History {
		d.Histories = append(d.Histories, reportHistory{Subject: s.String(), Index: []int{}})
	}
	var all []Row
	pk := &packer{dict: map[string]int{}, p: packedRows{Table: []int{}, Rejected: []int{}, Rows: [][]any{}}}
	errStop := errors.New("stop")
	err := src.Read(ctx, func(it replay.Item) error {
		if o.UntilSeq > 0 && it.Seq > o.UntilSeq || !o.UntilTime.IsZero() && it.Err == nil && it.Event.At.After(o.UntilTime) {
			return errStop
		}
		if it.Damaged && !o.SkipCorrupt {
			return fmt.Errorf("corrupt line: %w (--skip-corrupt folds it as a corrupt event)", it.Err)
		}
		st := f.Fold(it)
		row := rowOf(st)
		all = append(all, row)
		i := pk.add(row)
		if o.Filter.Match(st) {
			d.Shown++
			pk.p.Table = append(pk.p.Table, i)
		}
		if st.Result.Outcome == projections.Rejected || st.Result.Outcome == projections.Corrupt {
			pk.p.Rejected = append(pk.p.Rejected, i)
		}
		for h, s := range o.History {
			if st.Touch.Has(s) {
				d.Histories[h].Index = append(d.Histories[h].Index, i)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	d.Events, d.Packed = len(all), pk.p
	d.Timeline = buildTimeline(all)
	d.State = replay.StateJSON(f.State())
	d.Counters = f.State().Counters
	return writeReport(w, d)
}

var reportTmpl = template.Must(template.New("report").Parse(string(mustAsset("assets/report.html"))))

func writeReport(w io.Writer, d reportData) error {
	var raw bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&raw, gzip.BestCompression)
	enc := json.NewEncoder(zw)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return reportTmpl.Execute(w, map[string]any{
		"Title":  d.Title,
		"CSS":    template.CSS(mustAsset("assets/app.css")),
		"Render": template.JS(mustAsset("assets/render.js")),
		"Report": template.JS(mustAsset("assets/report.js")),
		"Data":   base64.StdEncoding.EncodeToString(raw.Bytes()),
		"Events": d.Events,
	})
}
