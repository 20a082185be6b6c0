package main

import (
	"github.com/spf13/pflag"

	"github.com/termlog/termlog/natsserver"
)

// syncValue is --sync of `termlog nats` and `termlog up`: when the embedded
// NATS server fsyncs JetStream writes. It is checked when the flag is parsed.
type syncValue natsserver.SyncPolicy

func (v *syncValue) String() string { return natsserver.SyncPolicy(*v).String() }
func (v *syncValue) Type() string   { return "always|interval" }
func (v *syncValue) Set(s string) error {
	p, err := natsserver.ParseSyncPolicy(s)
	if err != nil {
		return err
	}
	*v = syncValue(p)
	return nil
}

// syncFlag registers --sync (default always) on f.
func syncFlag(f *pflag.FlagSet, p *natsserver.SyncPolicy) {
	*p = natsserver.SyncAlways
	f.Var((*syncValue)(p), "sync", "when the embedded NATS server fsyncs JetStream writes: always (before it acknowledges each one; an acknowledged event survives a power loss) or interval (every 2m, nats-server's default: faster, but a power loss or OS crash loses the events acknowledged since the last sync)")
}
