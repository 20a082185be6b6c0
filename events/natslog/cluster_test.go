package natslog_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// Three nodes form a JetStream cluster: StartServer returns before the meta
// leader exists, WaitJetStream waits for it, and an R3 stream works from a
// connection that lists every node.
func TestCluster3Nodes(t *testing.T) {
	t.Parallel()
	_, urls := start3(t, natsserver.ServerConfig{})
	checkR3(t, connectAll(t, urls))
}

// start3 starts three nodes configured like base and waits for their
// JetStream meta leader.
func start3(t *testing.T, base natsserver.ServerConfig) ([]*natsserver.Server, []string) {
	t.Helper()
	var ports []int
	var routes []string
	for range 3 {
		ports = append(ports, testkit.FreePort(t))
		routes = append(routes, natsserver.RouteURL(ports[len(ports)-1]))
	}
	var srvs []*natsserver.Server
	var urls []string
	for i := range 3 {
		cfg := base
		cfg.DataDir, cfg.Name = t.TempDir(), fmt.Sprintf("n%d", i+1)
		cfg.ClusterName, cfg.ClusterPort, cfg.Routes = "test", ports[i], routes
		s, err := natsserver.StartServer(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
		if got, want := s.ClusterURL(), routes[i]; got != want {
			t.Errorf("ClusterURL = %q, want %q", got, want)
		}
		srvs = append(srvs, s)
		urls = append(urls, s.ClientURL())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var leader string
	for _, s := range srvs {
		l, err := s.WaitJetStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if leader != "" && l != leader {
			// Possible after a re-election, but not expected here.
			t.Logf("%s sees meta leader %s, another saw %s", s.Name(), l, leader)
		}
		leader = l
	}
	if leader == "" {
		t.Fatal("no meta leader")
	}
	return srvs, urls
}

// connectAll connects to every node of urls (as start3 returns them), with
// connect's dial timeout.
func connectAll(t *testing.T, urls []string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(strings.Join(urls, ","), append([]nats.Option{nats.Timeout(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// checkR3 appends to an R3 stream through nc and checks its replicas.
func checkR3(t *testing.T, nc *nats.Conn) {
	t.Helper()
	l := open(t, nc, natslog.Config{Replicas: 3})
	if seq, err := l.Append(ctxT(t), 0, ev(1, 0)); err != nil || seq != 1 {
		t.Fatalf("Append = %d, %v", seq, err)
	}
	st := streamOf(t, nc, l)
	if info := st.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream replicas %d, cluster %+v", info.Config.Replicas, info.Cluster)
	}
	testReplicatedAppends(t, nc)
}

// testReplicatedAppends: appends of several events to a replicated stream
// are atomic batches; they keep the Log contract (the logtest suite's
// append cases, checked through the stream API rather than Read).
func testReplicatedAppends(t *testing.T, nc *nats.Conn) {
	l := open(t, nc, natslog.Config{Cluster: "r3batch", Replicas: 3})
	st := streamOf(t, nc, l)
	if !st.CachedInfo().Config.AllowAtomicPublish {
		t.Fatal("replicated stream does not allow atomic batches")
	}
	group := func(term, first uint64, n int) []events.Event {
		out := make([]events.Event, n)
		for i := range out {
			out[i] = ev(term, first+uint64(i))
		}
		return out
	}
	wantAppend := func(expected uint64, evs []events.Event, want uint64) {
		t.Helper()
		if got, err := l.Append(ctxT(t), expected, evs...); err != nil || got != want {
			t.Fatalf("Append(expected %d, %d events) = %d, %v; want %d", expected, len(evs), got, err, want)
		}
	}
	wantTail := func(want uint64) {
		t.Helper()
		if got, err := l.Tail(ctxT(t)); err != nil || got != want {
			t.Fatalf("Tail = %d, %v; want %d", got, err, want)
		}
	}
	wantAppend(0, group(1, 1, 5), 5)
	wantAppend(5, []events.Event{ev(2, 100)}, 6) // a foreign writer
	// A group expecting 5 on tail 6: its later events' seqs would match the
	// log again, yet nothing of it lands.
	if _, err := l.Append(ctxT(t), 5, group(1, 10, 4)...); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("group after a foreign event: %v, want ErrFenced", err)
	}
	wantTail(6)
	// The refused ids (1-7..1-9) are not held as duplicates: the same
	// writer's next group uses them.
	g := group(1, 20, 3)
	wantAppend(6, g, 9)
	wantAppend(6, g, 9) // the retry of a landed group
	wantTail(9)
	// The retry of a group whose first half landed stores the rest once.
	h := group(1, 30, 4)
	wantAppend(9, h[:2], 11)
	wantAppend(9, h, 13)
	wantTail(13)
	// Chained appends (AppendAsync) are made one at a time there, the
	// chain checked against the event at the expected last seq.
	wantAsync := func(expected uint64, prev string, evs []events.Event, want uint64) {
		t.Helper()
		if got, err := l.AppendAsync(ctxT(t), expected, prev, evs...).Wait(ctxT(t)); err != nil || got != want {
			t.Fatalf("AppendAsync(expected %d, prev %q, %d events) = %d, %v; want %d", expected, prev, len(evs), got, err, want)
		}
	}
	wantAsync(13, "meta-1-1-13", group(1, 40, 2), 15)
	wantAsync(15, "meta-1-1-15", group(1, 50, 1), 16)
	// Retries of a landed chained group, the second read-checked.
	wantAsync(13, "meta-1-1-13", group(1, 40, 2), 15)
	wantAsync(15, "meta-1-1-15", group(1, 50, 1), 16)
	// Chained to an id the expected last seq does not hold: fenced, even
	// though that seq is the tail.
	if _, err := l.AppendAsync(ctxT(t), 16, "meta-1-1-15", group(1, 60, 2)...).Wait(ctxT(t)); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("append chained to a wrong id: %v, want ErrFenced", err)
	}
	// Another writer's log (no knowledge of our last id) took seq 17; a
	// group chained to our refused 17 with expected last seq 17 is fenced.
	other := open(t, nc, natslog.Config{Cluster: "r3batch", Replicas: 3})
	if _, err := other.Append(ctxT(t), 16, ev(2, 200)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.AppendAsync(ctxT(t), 17, "meta-1-1-17", group(1, 70, 2)...).Wait(ctxT(t)); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("append chained to an event another writer's took the seq of: %v, want ErrFenced", err)
	}
	wantTail(17)
	want := []string{"meta-1-1-1", "meta-1-1-2", "meta-1-1-3", "meta-1-1-4", "meta-1-1-5", "meta-1-2-6", "meta-1-1-7", "meta-1-1-8", "meta-1-1-9", "meta-1-1-10", "meta-1-1-11", "meta-1-1-12", "meta-1-1-13", "meta-1-1-14", "meta-1-1-15", "meta-1-1-16", "meta-1-2-17"}
	for i, id := range want {
		m, err := st.GetMsg(ctxT(t), uint64(i+1))
		if err != nil {
			t.Fatalf("seq %d: %v", i+1, err)
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != id {
			t.Errorf("seq %d holds msg id %q, want %q", i+1, got, id)
		}
	}
}

// A secure cluster: clients authenticate with role keys over TLS, and the
// nodes' routes are mutual TLS with the generated CA.
func TestCluster3NodesSecure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	auth, certs := filepath.Join(dir, "auth"), filepath.Join(dir, "tls")
	if _, err := natsserver.InitAuth(auth); err != nil {
		t.Fatal(err)
	}
	if _, err := natsserver.InitTLS(certs); err != nil {
		t.Fatal(err)
	}
	a, err := natsserver.LoadServerAuth(auth, "termlog")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, ca := filepath.Join(certs, natsserver.TLSCertFile), filepath.Join(certs, natsserver.TLSKeyFile), filepath.Join(certs, natsserver.TLSCAFile)
	tc, err := natsserver.ServerTLSConfig(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := natsserver.RouteTLSConfig(cert, key, ca)
	if err != nil {
		t.Fatal(err)
	}
	srvs, urls := start3(t, natsserver.ServerConfig{Auth: a, TLS: tc, RouteTLS: rc})
	opts, err := natsserver.RoleOptions(auth, natsserver.RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	checkR3(t, connectAll(t, urls, append(opts, nats.RootCAs(ca))...))
	// The route port speaks TLS only: a plaintext peer never gets the
	// route INFO, and a TLS peer without a certificate from the CA is
	// refused. (The nodes formed the cluster: theirs are accepted.)
	u, err := url.Parse(srvs[0].ClusterURL())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	if line, err := bufio.NewReader(conn).ReadString('\n'); err == nil || strings.Contains(line, "INFO") {
		t.Fatalf("a plaintext route peer read %q (%v)", line, err)
	}
	pool := x509.NewCertPool()
	pemCA, err := os.ReadFile(ca)
	if err != nil || !pool.AppendCertsFromPEM(pemCA) {
		t.Fatalf("CA: %v", err)
	}
	d := &net.Dialer{Timeout: 5 * time.Second}
	tconn, err := tls.DialWithDialer(d, "tcp", u.Host, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err == nil {
		defer tconn.Close()
		_ = tconn.SetDeadline(time.Now().Add(20 * time.Second))
		var line string
		if line, err = bufio.NewReader(tconn).ReadString('\n'); err == nil {
			t.Fatalf("a route peer without a certificate read %q", line)
		}
	}
	t.Logf("a route peer without a certificate: %v", err)
}
