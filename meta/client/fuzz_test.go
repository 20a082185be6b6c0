package client

import (
	"testing"
)

// FuzzDecoders: no request decoder panics, and whatever they accept is valid.
func FuzzDecoders(f *testing.F) {
	for _, s := range []string{
		`{"incarnation":"a","endpoint":"127.0.0.1:7001","kind":"compute","parallelism":4}`,
		`{"id":1,"epoch":2}`,
		`{"type":"hello","worker":1,"epoch":2,"term":3,"leader":"meta-1"}`,
		`{"type":"barrier","barrier":3}`,
		`{"incarnation":"a","endpoint":"[::1]:99999"}`,
		`nul`, `{}`, `[]`, `{"id":-1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeRegister(b); err == nil {
			if r.Incarnation == "" || ValidateEndpoint(r.Endpoint) != nil {
				t.Fatalf("accepted invalid registration %+v", r)
			}
		}
		if r, err := DecodeWorkerRef(b); err == nil && (r.ID == 0 || r.Epoch == 0) {
			t.Fatalf("accepted invalid ref %+v", r)
		}
		if m, err := DecodeControl(b); err == nil && m.Type != MsgHello && m.Type != MsgBarrier && m.Type != MsgAck {
			t.Fatalf("accepted unknown control message %+v", m)
		}
	})
}
