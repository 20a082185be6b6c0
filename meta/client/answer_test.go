package client

import (
	"bytes"
	"testing"
)

// Answer acks a barrier with its number and answers nothing else;
// AppendControl writes one line that DecodeControl reads back.
func TestAnswer(t *testing.T) {
	ack, ok := Answer(ControlMsg{Type: MsgBarrier, Barrier: 7})
	if !ok || ack != (ControlMsg{Type: MsgAck, Barrier: 7}) {
		t.Errorf("Answer(barrier 7) = %+v, %v; want ack 7", ack, ok)
	}
	for _, m := range []ControlMsg{{Type: MsgHello, Worker: 1, Epoch: 2}, {Type: MsgAck, Barrier: 3}} {
		if got, ok := Answer(m); ok {
			t.Errorf("Answer(%+v) = %+v: want no answer", m, got)
		}
	}
	b, err := AppendControl([]byte("x\n"), ack)
	if err != nil {
		t.Fatal(err)
	}
	if want := "x\n" + `{"type":"ack","barrier":7}` + "\n"; string(b) != want {
		t.Fatalf("AppendControl = %q, want %q", b, want)
	}
	got, err := DecodeControl(bytes.TrimSuffix(b[2:], []byte("\n")))
	if err != nil || got != ack {
		t.Errorf("decoded %+v, %v; want %+v", got, err, ack)
	}
}
