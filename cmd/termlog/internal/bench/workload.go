package bench

import (
	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
)

// workload is a realistic stream that applies cleanly: a dozen stores and
// 200 shards, then mostly worker registrations (a re-registration at a busy
// endpoint supersedes the old worker), activations, expiries and
// deregistrations over a fixed set of endpoints, shard observations, replica
// replacements (four events each) and now and then a new term.
type workload struct {
	events []events.Event
	bodies [][]byte
	bytes  int // total body bytes
}

func makeWorkload(n, endpoints int) (*workload, error) {
	s, err := eventgen.Mix(n, endpoints)
	if err != nil {
		return nil, err
	}
	return &workload{events: s.Events, bodies: s.Bodies, bytes: s.Bytes}, nil
}
