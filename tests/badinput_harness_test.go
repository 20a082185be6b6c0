package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/replay"
)

// running reports whether the replica's Run is still going (it returns only
// when stopped; a panic would have ended the test binary).
func (m *metaNode) running() bool {
	select {
	case <-m.done:
		return false
	default:
		return true
	}
}

func allRunning(t *testing.T, nodes ...*metaNode) {
	t.Helper()
	for _, n := range nodes {
		if !n.running() {
			t.Fatalf("%s is no longer running", n.ID())
		}
	}
}

// rpc sends one raw request to <cluster>.rpc.<name> and decodes the reply.
// No reply (a timeout or no responders) is an error.
func rpc(nc *nats.Conn, name string, body []byte) (client.Reply, error) {
	msg, err := nc.Request(client.RPCSubject(cluster, name), body, 5*time.Second)
	if err != nil {
		return client.Reply{}, err
	}
	var rep client.Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return client.Reply{}, errors.New("undecodable reply " + string(msg.Data) + ": " + err.Error())
	}
	return rep, nil
}

// forceAppend appends ev as an admin with direct access to the stream would:
// at the tail, with the expected-last-seq check, retrying while the leader
// appends meanwhile. It returns ev's seq.
func forceAppend(t *testing.T, lg *natslog.Log, ev events.Event) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		tail, err := lg.Tail(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seq, err := lg.Append(ctx, tail, ev)
		if err == nil {
			return seq
		}
		if !errors.Is(err, events.ErrFenced) {
			t.Fatalf("forced append: %v", err)
		}
	}
}

// publishRaw stores body on subject in the event stream, with the
// Nats-Expected-Last-Sequence header set to the tail (retrying when the
// leader appends meanwhile), bypassing the codec. It returns its seq.
func publishRaw(t *testing.T, nc *nats.Conn, lg *natslog.Log, subject string, body []byte) uint64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for {
		tail, err := lg.Tail(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: body},
			jetstream.WithExpectStream(lg.Stream()), jetstream.WithExpectLastSequence(tail))
		if err == nil {
			return ack.Sequence
		}
		var apiErr *jetstream.APIError
		if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10071 && apiErr.ErrorCode != 10164 {
			t.Fatalf("publish to %s: %v", subject, err)
		}
	}
}

func anomalyAt(v *projections.State, seq uint64) (projections.Anomaly, bool) {
	for _, a := range v.Anomalies {
		if a.Seq == seq {
			return a, true
		}
	}
	return projections.Anomaly{}, false
}

// rejectedEntry is one line of `termlog replay --rejected --json`.
type rejectedEntry struct {
	Seq     uint64 `json:"seq"`
	Term    uint64 `json:"term"`
	Writer  string `json:"writer"`
	Type    string `json:"type"`
	Outcome string `json:"outcome"`
	Kind    string `json:"kind"`
	Reason  string `json:"reason"`
}

// rejectedListing is what `termlog replay --rejected --json` prints for the
// live stream: the same replay.Run call on replay.Stream.
func rejectedListing(t *testing.T, lg *natslog.Log) []rejectedEntry {
	t.Helper()
	var out bytes.Buffer
	if err := replay.Run(t.Context(), replay.Stream(lg), replay.Options{Mode: replay.ModeRejected, JSON: true}, &out); err != nil {
		t.Fatalf("replay --rejected: %v", err)
	}
	var list []rejectedEntry
	dec := json.NewDecoder(&out)
	for dec.More() {
		var e rejectedEntry
		if err := dec.Decode(&e); err != nil {
			t.Fatalf("replay --rejected output: %v", err)
		}
		list = append(list, e)
	}
	return list
}
