package replay

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/termlog/termlog/projections"
)

// Diff is what changed from one state to a later one.
type Diff struct {
	From         projections.Provenance       `json:"from"`
	To           projections.Provenance       `json:"to"`
	Term         *Change[uint64]              `json:"term,omitempty"`
	Leader       *Change[string]              `json:"leader,omitempty"`
	NextWorkerID *Change[uint64]              `json:"next_worker_id,omitempty"`
	Workers      Entities[projections.Worker] `json:"workers"`
	Stores       Entities[projections.Store]  `json:"stores"`
	Shards       Entities[projections.Shard]  `json:"shards"`
	// Operators are the running ones.
	Operators Entities[projections.Operator] `json:"operators"`
	// Ended are operators that ended after From (from the bounded history).
	Ended []projections.Operator `json:"ended,omitempty"`
	// Counters holds the counters that changed, by their JSON name.
	Counters map[string]Change[uint64] `json:"counters,omitempty"`
	// Anomalies are those recorded after From (from the bounded list).
	Anomalies []projections.Anomaly `json:"anomalies,omitempty"`
}

// Change is a value before and after.
type Change[T any] struct {
	From T `json:"from"`
	To   T `json:"to"`
}

// Entities is the diff of one kind of entity.
type Entities[T any] struct {
	Added   []T       `json:"added,omitempty"`
	Removed []T       `json:"removed,omitempty"`
	Changed []Changed `json:"changed,omitempty"`
}

// Changed is an entity present in both states with different fields.
type Changed struct {
	ID     string        `json:"id"`
	Fields []FieldChange `json:"fields"`
}

// FieldChange is one field (by its JSON name) before and after, as JSON.
type FieldChange struct {
	Field string          `json:"field"`
	From  json.RawMessage `json:"from"`
	To    json.RawMessage `json:"to"`
}

// Empty reports whether nothing changed.
func (d Diff) Empty() bool {
	return d.Term == nil && d.Leader == nil && d.NextWorkerID == nil &&
		d.Workers.empty() && d.Stores.empty() && d.Shards.empty() && d.Operators.empty() &&
		len(d.Ended) == 0 && len(d.Counters) == 0 && len(d.Anomalies) == 0
}

func (e Entities[T]) empty() bool { return len(e.Added)+len(e.Removed)+len(e.Changed) == 0 }

// Compare returns what changed from a to b. Neither is modified.
func Compare(a, b *projections.State) Diff {
	d := Diff{From: a.Provenance, To: b.Provenance}
	if a.Term != b.Term {
		d.Term = &Change[uint64]{a.Term, b.Term}
	}
	if a.Leader != b.Leader {
		d.Leader = &Change[string]{a.Leader, b.Leader}
	}
	if a.NextWorkerID != b.NextWorkerID {
		d.NextWorkerID = &Change[uint64]{a.NextWorkerID, b.NextWorkerID}
	}
	d.Workers = compareLists(a.ListWorkers(), b.ListWorkers(), func(w projections.Worker) string { return fmt.Sprint(w.ID) })
	d.Stores = compareLists(a.ListStores(), b.ListStores(), func(s projections.Store) string { return s.ID })
	d.Shards = compareLists(a.ListShards(), b.ListShards(), func(s projections.Shard) string { return fmt.Sprint(s.ID) })
	d.Operators = compareLists(operators(a), operators(b), func(o projections.Operator) string { return o.ID })
	for _, op := range b.History {
		if op.Finished > a.Seq {
			d.Ended = append(d.Ended, op)
		}
	}
	d.Counters = map[string]Change[uint64]{}
	ca, cb := a.Counters, b.Counters
	for _, c := range []struct {
		name     string
		from, to uint64
	}{
		{"applied", ca.Applied, cb.Applied}, {"noops", ca.NoOps, cb.NoOps}, {"rejected", ca.Rejected, cb.Rejected},
		{"stale_term", ca.StaleTerm, cb.StaleTerm}, {"corrupt", ca.Corrupt, cb.Corrupt},
	} {
		if c.from != c.to {
			d.Counters[c.name] = Change[uint64]{c.from, c.to}
		}
	}
	if len(d.Counters) == 0 {
		d.Counters = nil
	}
	for _, an := range b.Anomalies {
		if an.Seq > a.Seq {
			d.Anomalies = append(d.Anomalies, an)
		}
	}
	return d
}

func operators(s *projections.State) []projections.Operator {
	out := make([]projections.Operator, 0, len(s.Operators))
	for _, id := range sortedKeys(s.Operators) {
		if op := s.Operators[id]; op != nil {
			out = append(out, *op)
		}
	}
	return out
}

// compareLists diffs two lists ordered by id (the order List* return).
func compareLists[T any](a, b []T, id func(T) string) Entities[T] {
	var e Entities[T]
	ia := map[string]T{}
	for _, x := range a {
		ia[id(x)] = x
	}
	ib := map[string]bool{}
	for _, y := range b {
		ib[id(y)] = true
		x, ok := ia[id(y)]
		if !ok {
			e.Added = append(e.Added, y)
			continue
		}
		if fields := compareFields(x, y); len(fields) > 0 {
			e.Changed = append(e.Changed, Changed{ID: id(y), Fields: fields})
		}
	}
	for _, x := range a {
		if !ib[id(x)] {
			e.Removed = append(e.Removed, x)
		}
	}
	return e
}

// compareFields compares two values field by field through their JSON form.
func compareFields(a, b any) []FieldChange {
	fa, fb := fieldsOf(a), fieldsOf(b)
	keys := make([]string, 0, len(fa)+len(fb))
	for k := range fa {
		keys = append(keys, k)
	}
	for k := range fb {
		if _, ok := fa[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []FieldChange
	for _, k := range keys {
		va, vb := fa[k], fb[k]
		if bytes.Equal(va, vb) {
			continue
		}
		out = append(out, FieldChange{Field: k, From: orNull(va), To: orNull(vb)})
	}
	return out
}

func fieldsOf(v any) map[string]json.RawMessage {
	b, err := json.Marshal(v)
	m := map[string]json.RawMessage{}
	if err == nil {
		_ = json.Unmarshal(b, &m)
	}
	return m
}

func orNull(b json.RawMessage) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return b
}

// Render is the diff for people: one line per change, "+" added, "-"
// removed, "~" changed.
func (d Diff) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "diff seq %d (term %d) -> seq %d (term %d)\n", d.From.Seq, d.From.Term, d.To.Seq, d.To.Term)
	if d.Empty() {
		b.WriteString("no change\n")
		return b.String()
	}
	if d.Term != nil {
		fmt.Fprintf(&b, "term %d -> %d\n", d.Term.From, d.Term.To)
	}
	if d.Leader != nil {
		fmt.Fprintf(&b, "leader %s -> %s\n", orDash(d.Leader.From), orDash(d.Leader.To))
	}
	if d.NextWorkerID != nil {
		fmt.Fprintf(&b, "next_worker_id %d -> %d\n", d.NextWorkerID.From, d.NextWorkerID.To)
	}
	renderEntities(&b, "worker", d.Workers, workerLine)
	renderEntities(&b, "store", d.Stores, storeLine)
	renderEntities(&b, "shard", d.Shards, shardLine)
	renderEntities(&b, "operator", d.Operators, operatorLine)
	for _, op := range d.Ended {
		fmt.Fprintf(&b, "ended %s\n", operatorLine(op))
	}
	if len(d.Counters) > 0 {
		var parts []string
		for _, k := range sortedKeys(d.Counters) {
			c := d.Counters[k]
			parts = append(parts, fmt.Sprintf("%s %d -> %d (%+d)", k, c.From, c.To, int64(c.To-c.From)))
		}
		fmt.Fprintf(&b, "counters %s\n", strings.Join(parts, ", "))
	}
	for _, a := range d.Anomalies {
		fmt.Fprintf(&b, "+ %s\n", anomalyLine(a))
	}
	return b.String()
}

func renderEntities[T any](b *strings.Builder, kind string, e Entities[T], line func(T) string) {
	for _, x := range e.Removed {
		fmt.Fprintf(b, "- %s\n", line(x))
	}
	for _, x := range e.Added {
		fmt.Fprintf(b, "+ %s\n", line(x))
	}
	for _, c := range e.Changed {
		parts := make([]string, 0, len(c.Fields))
		for _, f := range c.Fields {
			parts = append(parts, fmt.Sprintf("%s %s -> %s", f.Field, textValue(f.From), textValue(f.To)))
		}
		fmt.Fprintf(b, "~ %s %s: %s\n", kind, c.ID, strings.Join(parts, ", "))
	}
}

// textValue renders a field's JSON value in the style of the state's lines
// (replica sets as {1:log-0 2:log-1}, words bare, "-" for none), so a diff
// reads like the states it compares; --json keeps the JSON.
func textValue(raw json.RawMessage) string {
	var v any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return string(raw)
	}
	return text(v)
}

func text(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		switch {
		case x == "":
			return "-"
		case strings.ContainsAny(x, " \t\n\"{}:,"):
			return strconv.Quote(x)
		}
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	case []any:
		if len(x) == 0 {
			return "-"
		}
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = text(e)
		}
		return strings.Join(parts, ",")
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		// Replica ids sort as numbers, other keys as words.
		slices.SortFunc(keys, func(a, b string) int {
			na, ea := strconv.ParseUint(a, 10, 64)
			nb, eb := strconv.ParseUint(b, 10, 64)
			if ea == nil && eb == nil {
				return cmp.Compare(na, nb)
			}
			return strings.Compare(a, b)
		})
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + ":" + text(x[k])
		}
		return "{" + strings.Join(parts, " ") + "}"
	}
	return fmt.Sprint(v)
}
