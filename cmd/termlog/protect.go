package main

import (
	"context"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
)

// upOpenStream is up's own open of the event stream with the admin key,
// before any replica opens it: it creates the stream, or gives a stream an
// older termlog made what this one needs (deny delete and purge, atomic
// batches, the message size limit), which the meta role may not (it may
// create the stream but not update it).
func upOpenStream(ctx context.Context, srv *embeddedNATS, cluster string, replicas int) error {
	nc, err := srv.Connect(0, "termlog-up-admin", natsserver.RoleAdmin)
	if err != nil {
		return err
	}
	defer nc.Close()
	_, err = natslog.Open(ctx, nc, natslog.Config{Cluster: cluster, Replicas: replicas})
	return err
}
