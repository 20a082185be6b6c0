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
	Title     string               `json:"title"`
	Generated time.Time            `json:"generated"`
	Events    int                  `json:"events"` // entries folded
	Shown     int                  `json:"shown"`  // rows in the table (the filter's)
	Filter    string               `json:"filter,omitempty"`
	Rows      []Row                `json:"rows"`
	Rejected  []Row                `json:"rejected"`
	Timeline  Timeline             `json:"timeline"`
	State     any                  `json:"state"`
	Histories []reportHistory      `json:"histories"`
	Counters  projections.Counters `json:"counters"`
}

type reportHistory struct {
	Subject string `json:"subject"`
	Rows    []Row  `json:"rows"`
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
	d := reportData{Title: o.Title, Generated: now().UTC(), Rows: []Row{}, Rejected: []Row{}, Histories: []reportHistory{}}
	if o.Filter != (replay.Filter{}) {
		d.Filter = fmt.Sprintf("%+v", o.Filter)
	}
	for _, s := range o.History {
		d.Histories = append(d.Histories, reportHistory{Subject: s.String(), Rows: []Row{}})
	}
	var all []Row
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
		row.Data, row.Touch, row.Line = nil, nil, 0 // the summary says it; keeps the file small
		all = append(all, row)
		if o.Filter.Match(st) {
			d.Rows = append(d.Rows, row)
		}
		if st.Result.Outcome == projections.Rejected || st.Result.Outcome == projections.Corrupt {
			d.Rejected = append(d.Rejected, row)
		}
		for i, s := range o.History {
			if st.Touch.Has(s) {
				d.Histories[i].Rows = append(d.Histories[i].Rows, row)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return err
	}
	d.Events, d.Shown = len(all), len(d.Rows)
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
