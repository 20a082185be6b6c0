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
