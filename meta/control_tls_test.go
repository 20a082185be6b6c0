package meta

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

// mutualTLS generates a CA and a 127.0.0.1 certificate into a fresh dir and
// returns the mutual TLS config of a peer holding them.
func mutualTLS(t *testing.T) *tls.Config {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "tls")
	if _, err := natsserver.InitTLS(dir); err != nil {
		t.Fatal(err)
	}
	c, err := natsserver.MutualTLSConfig(filepath.Join(dir, natsserver.TLSCertFile), filepath.Join(dir, natsserver.TLSKeyFile), filepath.Join(dir, natsserver.TLSCAFile))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestControlStreamTLS runs the leader's control loop against a real agent
// on 127.0.0.1 with every combination of TLS configs that matters: the
// session opens and acks the barrier only when both sides agree (both
// plaintext, or mutual TLS with one CA); a plaintext leader, a leader
// without a certificate or with one of another CA is dropped in the
// agent's handshake, and a TLS leader's handshake is refused by a
// plaintext agent. The agent never accepts such a session and the worker
// stays waiting in the leader's recovery.
func TestControlStreamTLS(t *testing.T) {
	mtls := mutualTLS(t)
	other := mutualTLS(t)
	noCert := &tls.Config{RootCAs: mtls.RootCAs, MinVersion: tls.VersionTLS12}

	tlsFailed := func(s client.AgentStats) bool { return s.TLSFails >= 2 }
	refused := func(s client.AgentStats) bool { return s.Refused >= 2 }
	for _, tc := range []struct {
		name          string
		leader, agent *tls.Config
		// failed, when set, is how the agent shows two failed attempts; nil:
		// the session must open.
		failed func(client.AgentStats) bool
	}{
		{"plaintext", nil, nil, nil},
		{"mutual TLS", mtls, mtls, nil},
		{"plaintext leader, TLS agent", nil, mtls, tlsFailed},
		{"TLS leader, plaintext agent", mtls, nil, refused},
		{"TLS leader without a certificate", noCert, mtls, tlsFailed},
		{"TLS leader of another CA", other, mtls, tlsFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewManual(t0)
			tl := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) { c.ControlTLS = tc.leader })
			if err := tl.startTerm(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			var (
				mu sync.Mutex
				me client.WorkerRef
			)
			agent, err := client.ListenAgentTLS("127.0.0.1:0", tc.agent, zerolog.Nop(), func() client.WorkerRef {
				mu.Lock()
				defer mu.Unlock()
				return me
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			wg.Go(func() {
				if err := agent.Run(ctx); err != nil {
					t.Errorf("agent: %v", err)
				}
			})
			rep := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "w1", Endpoint: agent.Addr()})
			if rep.Error != nil {
				t.Fatal(rep.Error)
			}
			mu.Lock()
			me = client.WorkerRef{ID: rep.ID, Epoch: rep.Epoch, Incarnation: "w1"}
			mu.Unlock()
			wg.Go(func() { tl.duties.recovery.controlLoop(ctx) })

			if tc.failed == nil {
				advancing(t, clk, "the barrier acked over the control stream", func() bool {
					r := tl.recovery()
					return r.State == RecoveryComplete && r.Sessions[agent.Addr()] == rep.ID
				})
				// The agent counts its ack after sending it: the leader
				// can see the ack first.
				advancing(t, clk, "the agent to count its ack", func() bool { return agent.Stats().Acked == 1 })
				if s := agent.Stats(); s.Accepted != 1 || s.Acked != 1 || s.TLSFails != 0 || s.Refused != 0 {
					t.Fatalf("agent stats %+v: want one accepted session that acked barrier 1", s)
				}
				return
			}
			advancing(t, clk, "two failed control stream attempts", func() bool { return tc.failed(agent.Stats()) })
			if s := agent.Stats(); s.Accepted != 0 || s.Active {
				t.Fatalf("agent stats %+v: a session was accepted", s)
			}
			// The leader may have written its hello and barrier into a TCP or
			// TLS 1.3 connection the agent then dropped (it cannot tell before
			// reading), but no barrier was acked.
			r := tl.recovery()
			if r.State != RecoveryRecovering || !slices.Contains(r.Waiting, rep.ID) {
				t.Fatalf("recovery %+v: want still recovering with worker %d waiting", r, rep.ID)
			}
		})
	}
}
