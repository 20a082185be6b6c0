package client

import (
	"testing"
)

// FuzzDecoders: no request decoder panics, and whatever they accept is valid.
func FuzzDecoders(f *testing.F) {
	for _, s := range []string{
		`{"incarnation":"a","endpoint":"127.0.0.1:7001","kind":"compute","parallelism":4}`,
		`{"id":1,"epoch":2,"incarnation":"a"}`,
		`{"id":1,"epoch":2}`,
		`{"id":1,"epoch":2,"incarnation":""}`,
		`{"type":"hello","worker":1,"epoch":2,"term":3,"leader":"meta-1"}`,
		`{"type":"barrier","barrier":3}`,
		`{"incarnation":"a","endpoint":"[::1]:99999"}`,
		`nul`, `{}`, `[]`, `{"id":-1}`, ``, `{"please":true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeRegister(b); err == nil {
			if r.Incarnation == "" || ValidateEndpoint(r.Endpoint) != nil {
				t.Fatalf("accepted invalid registration %+v", r)
			}
		}
		if r, err := DecodeWorkerRef(b); err == nil && (r.ID == 0 || r.Epoch == 0 || r.Incarnation == "" || len(r.Incarnation) > MaxFieldBytes) {
			t.Fatalf("accepted invalid ref %+v", r)
		}
		if m, err := DecodeControl(b); err == nil && m.Type != MsgHello && m.Type != MsgBarrier && m.Type != MsgAck {
			t.Fatalf("accepted unknown control message %+v", m)
		}
		if err := DecodeStepDown(b); err == nil && len(b) > MaxRequestBytes {
			t.Fatalf("accepted a step-down of %d bytes", len(b))
		}
	})
}

// FuzzStoreDecoders: the store RPC decoders (store.register,
// store.heartbeat, store.drain on the leader; exec on a store) never panic,
// refuse what is too large, and whatever they accept is valid.
func FuzzStoreDecoders(f *testing.F) {
	for _, s := range []string{
		`{"store":"store-1","incarnation":"i-1","raft_addr":"127.0.0.1:9001"}`,
		`{"store":"store-1","incarnation":"","raft_addr":"127.0.0.1:9001"}`,
		`{"store":"bad id","incarnation":"i","raft_addr":"127.0.0.1:9001"}`,
		`{"store":"store-1","incarnation":"i-1","shards":[{"shard":1,"replica":2,"replicas":{"2":"127.0.0.1:9001"},"leader":2,"term":3,"ccid":4,"pending":false}],"skipped":[{"shard":1,"replica":9,"reason":"removed"}]}`,
		`{"store":"store-1","incarnation":"i-1","shards":[{"shard":0,"replica":2}]}`,
		`{"store":"store-1","shards":[{"shard":1,"replica":2,"replicas":{"x":"y"}}]}`,
		`{"op":"add","shard":1,"replica":4,"addr":"127.0.0.1:9004","timeout_ms":500}`,
		`{"op":"remove","shard":1,"replica":4}`,
		`{"op":"remove","shard":1,"replica":4,"term":3,"operator":"op-1-9","intent":12,"ccid":5}`,
		`{"op":"add","shard":1,"replica":4,"addr":"127.0.0.1:9004","term":3,"operator":"op-1-9","intent":14}`,
		`{"store":"store-1","incarnation":"i-1","for_ms":900000}`,
		`{"store":"store-1","incarnation":"i-1","for_ms":0}`,
		`{"op":"membership","shard":1}`,
		`{"op":"add","shard":1,"replica":4,"addr":"nohostport"}`,
		`{"op":"nope","shard":1}`,
		`{"store":"store-1","for_ms":60000}`,
		`{"store":"store-1","for_ms":-1}`,
		`{"store":"store-1","for_ms":1e30}`,
		`nul`, `{}`, `[]`, ``, `{"store":"s","extra":1}`, `{"store":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeStoreRegister(b); err == nil {
			if len(b) > MaxRequestBytes || ValidateStoreID(r.Store) != nil || r.Incarnation == "" ||
				len(r.Incarnation) > MaxFieldBytes || ValidateEndpoint(r.RaftAddr) != nil {
				t.Fatalf("accepted invalid store registration %+v", r)
			}
		}
		if h, err := DecodeStoreHeartbeat(b); err == nil {
			if len(b) > MaxHeartbeatBytes || ValidateStoreID(h.Store) != nil {
				t.Fatalf("accepted invalid store heartbeat %+v", h)
			}
			for _, s := range h.Shards {
				if s.Shard == 0 || s.Replica == 0 {
					t.Fatalf("accepted a shard report without ids: %+v", s)
				}
			}
		}
		if r, err := DecodeExec(b); err == nil {
			if len(b) > MaxRequestBytes || r.Shard == 0 {
				t.Fatalf("accepted invalid exec %+v", r)
			}
			switch r.Op {
			case ExecMembership:
			case ExecRemove:
				if r.Replica == 0 || r.Term == 0 || r.Operator == "" || r.Intent == 0 {
					t.Fatalf("accepted remove without a replica or its fence: %+v", r)
				}
			case ExecAdd:
				if r.Replica == 0 || ValidateEndpoint(r.Addr) != nil || r.Term == 0 || r.Operator == "" || r.Intent == 0 {
					t.Fatalf("accepted invalid or unfenced add: %+v", r)
				}
			default:
				t.Fatalf("accepted unknown exec op: %+v", r)
			}
		}
		if r, err := DecodeSelfDrain(b); err == nil {
			if len(b) > MaxRequestBytes || validStore(r.Store, r.Incarnation) != nil || r.ForMS <= 0 || r.ForMS > maxDrainMS {
				t.Fatalf("accepted invalid self-drain %+v", r)
			}
		}
		if r, err := DecodeDrain(b); err == nil {
			if len(b) > MaxRequestBytes || ValidateStoreID(r.Store) != nil || r.ForMS < 0 || r.ForMS > 7*24*3600*1000 {
				t.Fatalf("accepted invalid drain %+v", r)
			}
		}
	})
}
