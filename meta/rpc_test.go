package meta

import (
	"context"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/wire"
	"github.com/termlog/termlog/meta/client"
)

// TestRPCTableIsTheWire: the leader serves exactly the RPCs internal/wire
// names (the roles' permissions are built from those names), one row each,
// and only the heartbeat is answered from memory, on its own queue.
func TestRPCTableIsTheWire(t *testing.T) {
	l := newTestLeader(t, "meta-1", events.NewMemLog(), clock.NewManual(t0), 1)
	if err := l.startTerm(ctxT(t)); err != nil { // the rows call the started term's duties
		t.Fatal(err)
	}
	rows := leaderRPCs(l.leaderSession)
	var served []string
	for name, r := range rows {
		served = append(served, name)
		if r.decode == nil || r.serve == nil {
			t.Errorf("row %s: decode or serve missing", name)
		}
		if r.memory != (name == wire.RPCHeartbeat) {
			t.Errorf("row %s: memory = %v, want it only for %s", name, r.memory, wire.RPCHeartbeat)
		}
	}
	wired := slices.Concat(wire.WorkerRPCs, wire.StoreRPCs, wire.AdminRPCs)
	sort.Strings(served)
	sort.Strings(wired)
	if !slices.Equal(served, wired) {
		t.Fatalf("the table serves %v; internal/wire names %v", served, wired)
	}
}

// rpcSeeds are requests of every RPC the table serves: a valid one, and
// bodies each decoder must refuse.
var rpcSeeds = map[string][]string{
	wire.RPCRegister:       {`{"incarnation":"a","endpoint":"127.0.0.1:7001","kind":"compute","parallelism":4}`, `{"incarnation":"a","endpoint":"nohostport"}`},
	wire.RPCActivate:       {`{"id":1,"epoch":2,"incarnation":"a"}`, `{"id":1,"epoch":2,"incarnation":""}`},
	wire.RPCHeartbeat:      {`{"id":1,"epoch":2,"incarnation":"a"}`, `{"id":"x"}`},
	wire.RPCDeregister:     {`{"id":1,"epoch":2,"incarnation":"mallory"}`, `{"id":1,"epoch":2,"incarnation":"a","extra":true}`},
	wire.RPCStepDown:       {`{}`, `{"please":true}`, `[]`},
	wire.RPCStoreRegister:  {`{"store":"store-1","incarnation":"i-1","raft_addr":"127.0.0.1:9001"}`, `{"store":"bad id","incarnation":"i","raft_addr":"127.0.0.1:9001"}`},
	wire.RPCStoreHeartbeat: {`{"store":"store-1","incarnation":"i-1","shards":[{"shard":1,"replica":2,"replicas":{"2":"127.0.0.1:9001"},"leader":2,"term":3,"ccid":4}]}`, `{"store":"store-1","shards":[{"shard":0,"replica":2}]}`},
	wire.RPCStoreDrain:     {`{"store":"store-1","for_ms":60000}`, `{"store":"store-1","for_ms":-1}`},
	wire.RPCStoreSelfDrain: {`{"store":"store-1","incarnation":"i-1","for_ms":900000}`, `{"store":"store-1","incarnation":"i-1","for_ms":0}`},
	wire.RPCShardRecover:   {`{"shard":1,"from":"store-1","operator":"ops","dry_run":true}`, `{"shard":0,"from":"store-1","operator":"ops"}`},
	"nope":                 {`{}`},
	"store.nope":           {`{}`},
	"":                     {``},
}

// FuzzRPCTable: no request makes the leader's RPC table panic, whatever
// its RPC name and body. A name without a row, or a body its row's decoder
// refuses, is answered bad_request with the decoder's reason and appends
// nothing; every other answer is a reply or an error with a known code and
// a message. The seeds run in every `go test`; to fuzz:
//
//	go test -run '^$' -fuzz FuzzRPCTable -fuzztime 30s ./meta/
func FuzzRPCTable(f *testing.F) {
	for name, bodies := range rpcSeeds {
		for _, b := range append(bodies, ``, `nul`, `{}`, `[]`, `{"id":-1}`) {
			f.Add(name, []byte(b))
		}
	}
	log := events.NewMemLog()
	l := newTestLeader(f, "meta-1", log, clock.NewManual(t0), 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	f.Cleanup(cancel)
	if err := l.startTerm(ctx); err != nil {
		f.Fatal(err)
	}
	s := l.rpcs()
	for name, r := range s.rows {
		if _, err := r.decode([]byte(rpcSeeds[name][0])); err != nil {
			f.Fatalf("the first seed of %s is refused (%v): the seeds must reach every row's handler", name, err)
		}
	}
	codes := []string{client.CodeBadRequest, client.CodeReregister, client.CodeForbidden, client.CodeNotLeader, client.CodeUnavailable}
	f.Fuzz(func(t *testing.T, name string, body []byte) {
		before, _ := log.Tail(ctx)
		rep := s.handle(ctx, name, body)
		var refused error
		r, known := s.rows[name]
		if known {
			_, refused = r.decode(body)
		}
		switch {
		case !known || refused != nil:
			if rep.Error == nil || rep.Error.Code != client.CodeBadRequest || rep.Error.Message == "" {
				t.Fatalf("%q %q: %+v, want bad_request", name, body, rep)
			}
			if known && rep.Error.Message != refused.Error() {
				t.Fatalf("%q %q: message %q, want the decoder's %q", name, body, rep.Error.Message, refused)
			}
			if after, _ := log.Tail(ctx); after != before {
				t.Fatalf("%q %q: a refused request appended (tail %d -> %d)", name, body, before, after)
			}
		case rep.Error != nil:
			if !slices.Contains(codes, rep.Error.Code) || rep.Error.Message == "" {
				t.Fatalf("%q %q: error %+v, want one of %v with a message", name, body, rep.Error, codes)
			}
		}
	})
}
