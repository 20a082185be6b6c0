package natslog

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// noConsumers is a stream on which no consumer can be made: every create
// goes unanswered, as while the JetStream meta group elects a leader.
type noConsumers struct{ jetstream.Stream }

func (noConsumers) CreateConsumer(context.Context, jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	return nil, nats.ErrTimeout
}

// WithoutConsumers makes l's reads run without a consumer (by message get
// only); call it before l is used.
func WithoutConsumers(l *Log) *Log {
	l.stream = noConsumers{l.stream}
	return l
}
