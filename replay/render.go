package replay

import "github.com/termlog/termlog/projections"

// The renderer of an event's outcome, exported for the web console and the
// HTML report: the words an operator reads in the browser are the words
// replay prints.

// StepJSON is one timeline entry as `replay --json` prints it.
type StepJSON = stepJSON

// ToJSON is the entry `replay --json` prints for st.
func ToJSON(st Step) StepJSON { return toJSON(st) }

// Outcome is the outcome column of the timeline: "applied", "noop",
// "rejected stale-term", "corrupt", ...
func Outcome(r projections.Result) string { return outcome(r) }

// Summary is the data column of the timeline: a one-line rendering of the
// entry's data.
func Summary(it Item) string { return summary(it) }

// FormatStep is the timeline line replay prints for st.
func FormatStep(st Step) string { return formatStep(st) }

// StateJSON is the document `replay --state --json` prints.
func StateJSON(s *projections.State) any { return stateJSON{Hash: s.Hash(), State: s} }

// RecordItem is the entry of a stored record of the live stream (seq and
// body), decoded as replay decodes it: a body that does not decode is a
// corrupt entry.
func RecordItem(seq uint64, body []byte) Item { return recordItem(seq, body, 0) }
