// Package view is a process's view of the cluster: the projections.State
// folded from the event stream, and the ways to read it. Every meta replica
// and every log store runs a Projector; a command that reads once (status,
// worker list, replay's comparisons, the bench) calls Load or LoadFrom.
//
// # Reading a view
//
// Three ways survive, one for each kind of reader:
//
//   - Projector.Peek(fn): the live state, held still while fn runs. No copy;
//     fn must be short, read only and keep nothing. For the leader's hot
//     paths (an RPC's ownership check, a heartbeat), which read a few fields
//     per call and would pay a clone per call otherwise.
//   - Projector.View(): an immutable copy, made at most once per change and
//     shared by every caller until the next event. For readers that hold the
//     state across a decision or a slow step (the scheduler, the snapshot
//     writer, status and metrics). WaitSeq and CatchUp wait, then return View.
//   - Load / LoadFrom: a one-shot fold to the stream's tail, from seq 1 or
//     from the newest usable snapshot, for a process that runs no
//     Projector. LoadFrom is Load with a snapshot store; they are one way,
//     the second naming where the fold started (Origin).
//
// The fourth copy found in meta, the leader's scratch state (the projection
// plus the events its term sent but the projection has not folded yet), is
// not a view: it is the group committer's private decision state, owned by
// it alone, and is never handed to a reader. It stays in package meta.
//
// # Ownership
//
// A Projector's Run owns its only goroutine and the only writer of the
// state; every other method is safe from any goroutine. A view handed out
// (View, Load) belongs to the caller and must not be modified: View's copy
// is shared with other callers.
//
// view imports events, projections and internal/clock only.
package view
