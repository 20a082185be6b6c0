package meta

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/meta/client"
)

// TestMemoryBatchAnswersEachItsOwn: heartbeats served together (one visit
// to the term's loop for all) are each answered their own reply, in the
// order they waited; one that does not decode is a bad_request and the
// others are still served.
func TestMemoryBatchAnswersEachItsOwn(t *testing.T) {
	var served [][]uint64
	s := &rpcServer{prefix: "termlog.rpc.", logger: zerolog.Nop(), rows: map[string]rpcRow{
		client.RPCHeartbeat: memoryRow(client.DecodeWorkerRef, func(refs []client.WorkerRef) []client.Reply {
			var ids []uint64
			reps := make([]client.Reply, len(refs))
			for i, r := range refs {
				ids = append(ids, r.ID)
				reps[i] = client.Reply{ID: r.ID, Epoch: r.Epoch * 10}
			}
			served = append(served, ids)
			return reps
		}),
	}}
	var batch []*nats.Msg
	for _, id := range []uint64{7, 3, 0, 9, 4} {
		m := nats.NewMsg("termlog.rpc." + client.RPCHeartbeat)
		m.Reply = fmt.Sprintf("_INBOX.%d", id)
		m.Data, _ = json.Marshal(client.WorkerRef{ID: id, Epoch: id + 1, Incarnation: fmt.Sprint("inc-", id)})
		if id == 0 {
			m.Data = []byte(`{"id":`) // does not decode
		}
		batch = append(batch, m)
	}
	got := map[string]client.Reply{}
	s.serveBatch(batch, func(m *nats.Msg, rep client.Reply) { got[m.Reply] = rep })
	if len(served) != 1 || fmt.Sprint(served[0]) != "[7 3 9 4]" {
		t.Fatalf("served %v, want the four that decode together, in order: [[7 3 9 4]]", served)
	}
	for _, id := range []uint64{7, 3, 9, 4} {
		if rep := got[fmt.Sprintf("_INBOX.%d", id)]; rep.ID != id || rep.Epoch != (id+1)*10 || rep.Error != nil {
			t.Errorf("heartbeat of worker %d answered %+v, want its own reply", id, rep)
		}
	}
	if rep := got["_INBOX.0"]; rep.Error == nil || rep.Error.Code != client.CodeBadRequest {
		t.Errorf("the request that does not decode: %+v, want bad_request", rep)
	}
}

// TestMemoryBatchServesRPCsInArrivalOrder: with two RPCs answered from
// memory in one batch, the RPC whose request came first is served first.
func TestMemoryBatchServesRPCsInArrivalOrder(t *testing.T) {
	var order []string
	serving := func(name string) rpcRow {
		return memoryRow(client.DecodeWorkerRef, func(refs []client.WorkerRef) []client.Reply {
			order = append(order, name)
			return make([]client.Reply, len(refs))
		})
	}
	s := &rpcServer{prefix: "termlog.rpc.", logger: zerolog.Nop(), rows: map[string]rpcRow{"a": serving("a"), "b": serving("b"), "c": serving("c")}}
	var batch []*nats.Msg
	for _, name := range []string{"c", "a", "c", "b", "a"} {
		m := nats.NewMsg("termlog.rpc." + name)
		m.Data, _ = json.Marshal(client.WorkerRef{ID: 1, Epoch: 2, Incarnation: "i"})
		batch = append(batch, m)
	}
	for range 20 { // a map's order differs from run to run
		order = nil
		s.serveBatch(batch, func(*nats.Msg, client.Reply) {})
		if fmt.Sprint(order) != "[c a b]" {
			t.Fatalf("served %v, want [c a b]: each RPC in the order of its first request", order)
		}
	}
}
