package main

import (
	"strings"
	"testing"

	"github.com/termlog/termlog/natsserver"
)

func TestReplicasFlag(t *testing.T) {
	root := newRoot()
	for _, bad := range []string{"2", "0", "x", "5"} {
		if err := root.PersistentFlags().Set("replicas", bad); err == nil {
			t.Errorf("--replicas %s accepted", bad)
		}
	}
	for _, good := range []string{"1", "3"} {
		if err := root.PersistentFlags().Set("replicas", good); err != nil {
			t.Errorf("--replicas %s: %v", good, err)
		}
	}
	g := &globals{cluster: "east", replicas: 3}
	if c := g.logConfig(); c.Cluster != "east" || c.Replicas != 3 {
		t.Errorf("logConfig = %+v", c)
	}
}

func TestNATSClusterFlags(t *testing.T) {
	base := natsserver.ServerConfig{DataDir: "d", Port: 4222}
	cfg, err := natsClusterOpts{}.serverConfig(base)
	if err != nil || cfg.ClusterName != "" || len(cfg.Routes) != 0 {
		t.Fatalf("standalone: %+v, %v", cfg, err)
	}
	routes := "nats-route://127.0.0.1:6222, nats-route://127.0.0.1:6223,nats-route://127.0.0.1:6224"
	cfg, err = natsClusterOpts{clusterName: "termlog", clusterPort: 6223, routes: routes}.serverConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Name != "termlog-nats-6223" || cfg.ClusterPort != 6223 || len(cfg.Routes) != 3 || cfg.Routes[1] != "nats-route://127.0.0.1:6223" {
		t.Fatalf("cluster node: %+v", cfg)
	}
	for _, tc := range []struct {
		o    natsClusterOpts
		want string
	}{
		{natsClusterOpts{clusterPort: 6222}, "--routes"},
		{natsClusterOpts{routes: routes}, "--cluster-port"},
		{natsClusterOpts{clusterPort: 6222, routes: "nats-route://0.0.0.0:6222"}, "127.0.0.1"},
	} {
		if _, err := tc.o.serverConfig(base); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error about %s", tc.o, err, tc.want)
		}
	}
}
