// Package replay reads a termlog event log — the live stream through an
// events.Log, or a JSONL export — folds it with projections, and answers
// questions about it: the timeline (filtered by worker, endpoint, store,
// shard, type, seq or time), the state at any seq or time, the history of
// one id, every rejected event, invariant checks after every event, and the
// diff between two seqs. It also exports a log to JSONL and imports JSONL
// into an empty log, seq for seq.
//
// Everything here is a pure fold over a Source plus formatting: no NATS, no
// goroutines, no global state, and no input makes it panic. The CLI
// (termlog replay) only parses flags into Options and hands Run a Source.
//
// # Export format
//
// One JSON object a line. A record that decodes is written by
// events.WriteJSONL: the envelope plus "seq", the public contract
//
//	{"seq":5,"v":1,"term":1,"writer":"meta-1","at":"...","type":"worker.expired","data":{"id":1,"epoch":2}}
//
// A stored record that does not decode (corrupt, forged, or written by a
// newer version) is kept byte for byte as a raw line:
//
//	{"seq":9,"raw":"this is not json","error":"seq 9: malformed event: ..."}
//	{"seq":9,"raw_base64":"/w==","error":"..."}
//
// "raw" holds the body when it is valid UTF-8, "raw_base64" (standard
// encoding) otherwise; "error" is for people and is ignored when read. A raw
// line is not a damaged line: the reader hands back the stored body, which
// the fold decodes like a record of the live stream (a corrupt anomaly, or a
// real event for a build that understands it), and Import stores the body
// as is. A line that is neither an event nor a raw line is damaged: Run stops
// on it with an error naming the line, unless Options.SkipCorrupt.
package replay
