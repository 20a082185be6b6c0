package natslog

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// replyMsg is a jetstream.Msg with only an ack subject.
type replyMsg struct {
	jetstream.Msg
	reply string
}

func (m replyMsg) Reply() string { return m.reply }

// TestSequences reads the consumer and stream sequences from both forms of
// the ack subject and refuses anything else (the read path checks every
// message's sequences; a message read end to end is in natslog_test.go).
func TestSequences(t *testing.T) {
	for _, c := range []struct {
		reply            string
		consumer, stream uint64
		ok               bool
	}{
		{"$JS.ACK.TERMLOG_X.cons.1.42.7.1732935600000000000.3", 7, 42, true},
		{"$JS.ACK.dom.ACCHASH.TERMLOG_X.cons.1.42.7.1732935600000000000.3.rand", 7, 42, true},
		{"$JS.ACK._.ACCHASH.TERMLOG_X.cons.2.18446744073709551615.1.1732935600000000000.0", 1, 18446744073709551615, true},
		{"$JS.ACK.TERMLOG_X.cons.1.42.7.1732935600000000000", 0, 0, false},
		{"$JS.ACK.TERMLOG_X.cons.1.42.7.1732935600000000000.3.x", 0, 0, false},
		{"$JS.NAK.TERMLOG_X.cons.1.42.7.1732935600000000000.3", 0, 0, false},
		{"$JS.ACK.TERMLOG_X.cons.1.4x.7.1732935600000000000.3", 0, 0, false},
		{"$JS.ACK.TERMLOG_X.cons.1.42..1732935600000000000.3", 0, 0, false},
		{"", 0, 0, false},
	} {
		cons, str, err := sequences(replyMsg{reply: c.reply})
		if (err == nil) != c.ok || cons != c.consumer || str != c.stream {
			t.Errorf("sequences(%q) = %d, %d, %v; want %d, %d, ok %v", c.reply, cons, str, err, c.consumer, c.stream, c.ok)
		}
	}
}
