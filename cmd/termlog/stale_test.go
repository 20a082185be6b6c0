package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/events/natslog/natslogtest"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// TestStatusDuringStreamElection: with the NATS node that leads the event
// stream SIGKILLed, the stream answers nothing until its Raft group
// campaigns (4-9 s); status, run at once with --timeout 3s, answers from
// the copy any replica serves (the leader's health record), marked stale,
// and exits 1: never 0, and not 2 after its whole timeout.
func TestStatusDuringStreamElection(t *testing.T) {
	bin := buildBinary(t)
	auth := authDir(t, bin, t.TempDir(), "auth")
	nodes, url := startNATS3(t, bin, "--auth-dir", auth)
	urls := strings.Join([]string{url(0), url(1), url(2)}, ",")
	t.Setenv("TERMLOG_NATS", urls)
	t.Setenv("TERMLOG_AUTH_DIR", auth)
	t.Setenv("TERMLOG_REPLICAS", "3")
	startProc(t, bin, "meta", "run", "--id", "meta-1")

	var before Status
	testkit.Eventually(t, 60*time.Second, "a healthy status with a health record", func() bool {
		code, st, _ := statusJSON(t, bin)
		before = st
		return (code == 0 || code == 1) && st.Stale == nil && st.Health.Record != nil && st.Leader == "meta-1"
	})

	js := adminJetStream(t, urls, auth)
	var leader string
	testkit.Eventually(t, 30*time.Second, "the event stream's leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		st, err := js.Stream(ctx, natslog.StreamName("termlog"))
		if err == nil && st.CachedInfo().Cluster != nil {
			leader = st.CachedInfo().Cluster.Leader
		}
		return leader != ""
	})
	var victim int
	if _, err := fmt.Sscanf(leader, "n%d", &victim); err != nil {
		t.Fatalf("stream leader %q: %v", leader, err)
	}
	victim--
	if err := nodes[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-nodes[victim].done

	r := runEnv(t, bin, nil, "status", "-o", "json", "--timeout", "3s")
	var st Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != 1 {
		t.Fatalf("status right after the stream leader's node (%s) was killed: exit %d, want 1 (a stale answer); %v\nstdout: %s\nstderr: %s", leader, r.code, err, r.stdout, r.stderr)
	}
	if st.Stale == nil || st.Health.Healthy || st.Stale.Seq == 0 || st.Stale.Seq > before.Seq+100 || st.Term < before.Term {
		t.Fatalf("status during the election: stale %+v, healthy %v, term %d (before: seq %d term %d): want a stale copy of term >= %d", st.Stale, st.Health.Healthy, st.Term, before.Seq, before.Term, before.Term)
	}
	if !strings.Contains(r.stderr, "STALE") {
		t.Fatalf("the exit reason does not say the answer is stale: %s", r.stderr)
	}
	t.Logf("killed %s; status: %s", leader, st.Stale)
}

// adminJetStream connects to url with the admin key of auth, closed when
// the test ends.
func adminJetStream(t *testing.T, url, auth string) jetstream.JetStream {
	t.Helper()
	opts, err := natsserver.RoleOptions(auth, natsserver.RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// The watchdog's probe of a fold counts a reader's consumer create left
// unanswered for staleAfter/2 as the JetStream meta leader silent, though
// account info and the stream's leader answer (after a follower node's
// crash, status waited its whole 2·staleAfter there: 1.04-1.27 s). Here
// the reader's user may not create consumers, so its creates go
// unanswered, and its Read is too long to read by get.
func TestProbeCountsAnUnansweredConsumerCreate(t *testing.T) {
	rnc := natslogtest.StreamDenyingConsumerCreates(t, "probe", 1500) // more than a Read may fetch by get
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	reader, err := natslog.Open(ctx, rnc, natslog.Config{Cluster: "probe", Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	if who := probe(ctx, rnc, "probe", stepFold, reader); who != "" {
		t.Fatalf("probe before any read: %q silent, want none", who)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- reader.Read(rctx, 1, func(events.Record) error { return nil }) }()
	defer func() { rcancel(); <-done }()
	var who string
	testkit.Eventually(t, 10*time.Second, "the probe naming the unanswered create", func() bool {
		who = probe(ctx, rnc, "probe", stepFold, reader)
		return who != ""
	})
	if !strings.Contains(who, "the JetStream meta leader (it creates the reader's consumer") {
		t.Fatalf("probe: %q silent, want the JetStream meta leader for the create", who)
	}
	t.Logf("probe: %s", who)
}
