package replay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// View is one side of DiffViews: a log (a JSONL export or the stream), or
// a state a replica recorded (a snapshot).
type View struct {
	// Name names the side in the answer ("a.jsonl").
	Name string
	// Log is the log to fold; nil when State is set.
	Log Source
	// State is a recorded state (projections.DecodeSnapshot); nil for a log.
	State *projections.State
}

// ViewDiff is where two views first differ.
type ViewDiff struct {
	A, B string // the views' names
	// Same reports that the views never differ: the logs fold to the same
	// state after every seq (and end at the same seq), or the snapshot is
	// the log's state at the snapshot's seq.
	Same bool
	// Seq is the seq after which they first differ (Same: the last seq).
	Seq uint64
	// StepA and StepB are the entries each log folded at Seq (nil: the log
	// has none there; a snapshot has none).
	StepA, StepB *Step
	// Diff is what changed from A's state to B's after Seq; its Anomalies
	// are those B keeps and A does not, Gone those A keeps and B does not.
	Diff Diff
	Gone []projections.Anomaly
	// Hash is the states' hash when Same.
	Hash string
	// Events is the number of seqs compared.
	Events uint64
}

// ErrViewsDiffer is returned (wrapped) by DiffViews when the views differ,
// after the answer is written.
var ErrViewsDiffer = errors.New("the views differ")

// DiffViews folds two views side by side and writes the first seq after
// which their states differ, the entry each folded there and how the
// states differ (Compare's lines), or that they are the same. Two logs are
// compared after every seq; a snapshot is compared with the other log's
// state at the snapshot's seq. Entries that are the same in both logs
// cannot make equal states differ, so the states are hashed only after
// entries that differ. It returns an error wrapping ErrViewsDiffer when the
// views differ.
func DiffViews(ctx context.Context, a, b View, out io.Writer) (ViewDiff, error) {
	d, err := diffViews(ctx, a, b)
	if err != nil {
		return d, err
	}
	if _, err := io.WriteString(out, d.Render()); err != nil {
		return d, fmt.Errorf("write: %w", err)
	}
	if !d.Same {
		return d, fmt.Errorf("%w after seq %d", ErrViewsDiffer, d.Seq)
	}
	return d, nil
}

func diffViews(ctx context.Context, a, b View) (ViewDiff, error) {
	d := ViewDiff{A: a.Name, B: b.Name}
	switch {
	case a.State != nil && b.State != nil:
		d.Seq = a.State.Seq
		d.setDiff(a.State, b.State)
		d.Same, d.Hash = a.State.Hash() == b.State.Hash(), a.State.Hash()
		if a.State.Seq != b.State.Seq {
			d.Same = false
		}
		return d, nil
	case a.State != nil || b.State != nil:
		return diffSnapshot(ctx, a, b)
	case a.Log == nil || b.Log == nil:
		return d, errors.New("diff: a view needs a log or a state")
	}
	// Two logs: B is read into memory, A is folded against it.
	var bs []Item
	if err := b.Log.Read(ctx, func(it Item) error {
		if it.Damaged {
			return fmt.Errorf("%s: corrupt line: %w", b.Name, it.Err)
		}
		bs = append(bs, it)
		return nil
	}); err != nil {
		return d, err
	}
	fa, fb := NewFolder(), NewFolder()
	i := 0
	differ := func(sa, sb *Step) bool {
		if fa.State().Hash() == fb.State().Hash() {
			return false
		}
		d.Seq = max(fa.State().Seq, fb.State().Seq)
		d.StepA, d.StepB = sa, sb
		d.setDiff(fa.State(), fb.State())
		return true
	}
	errFound := errors.New("found")
	err := a.Log.Read(ctx, func(it Item) error {
		if it.Damaged {
			return fmt.Errorf("%s: corrupt line: %w", a.Name, it.Err)
		}
		d.Events++
		sa := fa.Fold(it)
		if i >= len(bs) {
			if differ(&sa, nil) {
				return errFound
			}
			return nil
		}
		sb := fb.Fold(bs[i])
		i++
		if sameEntry(it, bs[i-1]) {
			return nil
		}
		if differ(&sa, &sb) {
			return errFound
		}
		return nil
	})
	switch {
	case errors.Is(err, errFound):
		return d, nil
	case err != nil:
		return d, err
	}
	for ; i < len(bs); i++ {
		d.Events++
		sb := fb.Fold(bs[i])
		if differ(nil, &sb) {
			return d, nil
		}
	}
	d.Same, d.Seq, d.Hash = true, fa.State().Seq, fa.State().Hash()
	return d, nil
}

// sameEntry reports whether two entries are the same event at the same
// seq (or the same stored body).
func sameEntry(a, b Item) bool {
	if a.Seq != b.Seq || (a.Err == nil) != (b.Err == nil) {
		return false
	}
	if a.Err != nil {
		return a.Body != nil && string(a.Body) == string(b.Body)
	}
	la, err1 := events.EncodeLine(a.Event)
	lb, err2 := events.EncodeLine(b.Event)
	return err1 == nil && err2 == nil && string(la) == string(lb)
}

// diffSnapshot compares a recorded state with a log's state at its seq.
func diffSnapshot(ctx context.Context, a, b View) (ViewDiff, error) {
	d := ViewDiff{A: a.Name, B: b.Name}
	snap, log, snapIsA := a.State, b.Log, true
	if snap == nil {
		snap, log, snapIsA = b.State, a.Log, false
	}
	if log == nil {
		return d, errors.New("diff: a view needs a log or a state")
	}
	f := NewFolder()
	var last *Step
	err := log.Read(ctx, func(it Item) error {
		if it.Seq > snap.Seq {
			return errStop
		}
		if it.Damaged {
			return fmt.Errorf("corrupt line: %w", it.Err)
		}
		d.Events++
		st := f.Fold(it)
		last = &st
		if f.State().Seq >= snap.Seq {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return d, err
	}
	d.Seq = snap.Seq
	from, to := snap, f.State()
	if !snapIsA {
		from, to = to, from
		d.StepA = last
	} else {
		d.StepB = last
	}
	d.setDiff(from, to)
	d.Same = snap.Hash() == f.State().Hash()
	d.Hash = snap.Hash()
	return d, nil
}

// setDiff compares two states that need not be one after the other: the
// anomalies are matched as sets, not by seq.
func (d *ViewDiff) setDiff(a, b *projections.State) {
	d.Diff = Compare(a, b)
	d.Diff.Anomalies, d.Gone = only(b.Anomalies, a.Anomalies), only(a.Anomalies, b.Anomalies)
}

// only lists the anomalies of x that y does not hold.
func only(x, y []projections.Anomaly) []projections.Anomaly {
	in := map[projections.Anomaly]int{}
	for _, a := range y {
		in[a]++
	}
	var out []projections.Anomaly
	for _, a := range x {
		if in[a] > 0 {
			in[a]--
			continue
		}
		out = append(out, a)
	}
	return out
}

// Render is the answer for people.
func (d ViewDiff) Render() string {
	var b strings.Builder
	if d.Same {
		fmt.Fprintf(&b, "same: %s and %s agree after every seq up to seq %d (hash %s)\n", d.A, d.B, d.Seq, d.Hash)
		return b.String()
	}
	fmt.Fprintf(&b, "the views differ first after seq %d\n", d.Seq)
	w := max(len(d.A), len(d.B)) + 1
	entry := func(name string, st *Step) {
		if st == nil {
			fmt.Fprintf(&b, "%-*s no entry at seq %d\n", w, name+":", d.Seq)
			return
		}
		fmt.Fprintf(&b, "%-*s %s\n", w, name+":", formatStep(*st))
	}
	if d.StepA != nil || d.StepB != nil {
		entry(d.A, d.StepA)
		entry(d.B, d.StepB)
	}
	fmt.Fprintf(&b, "how %s differs from %s:\n%s", d.B, d.A, d.Diff.Render())
	for _, a := range d.Gone {
		fmt.Fprintf(&b, "- %s\n", anomalyLine(a))
	}
	return b.String()
}
