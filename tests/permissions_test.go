package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// TestPermSecureClusterRuns runs a whole cluster with every connection
// authenticated as its role: the permissions are enough for metas to elect
// and hand over, workers to register and run, stores to register and host
// a 3/3 shard, and an observer to read the stream and the lease.
func TestPermSecureClusterRuns(t *testing.T) {
	c := newSecureCluster(t)
	// Metas store snapshots every few events, and stores read them: the
	// snapshot bucket's permissions are exercised too.
	o := schedOpts()
	o.snapshotEvery = 5
	m1 := c.startMeta("meta-1", o)
	m2 := c.startMeta("meta-2", o)
	c.storeSnapshots = true
	c.startWorker(testkit.FreeAddr(t), "w-1", 200*time.Millisecond)
	c.startWorker(testkit.FreeAddr(t), "w-2", 200*time.Millisecond)
	stores := []*storeNode{c.newStore("store-1"), c.newStore("store-2"), c.newStore("store-3")}

	healthy := func(what string) *metaNode {
		var leader *metaNode
		testkit.Eventually(t, 60*time.Second, what, func() bool {
			l, _ := leaderOf(m1, m2)
			if l == nil {
				return false
			}
			running := 0
			for _, w := range l.View().ListWorkers() {
				if w.State == "running" {
					running++
				}
			}
			rec, ok := currentRecovery(l)
			_, full := fullShard(l, 1, stores...)
			leader = l
			return running == 2 && ok && rec.State == meta.RecoveryComplete && full && len(l.View().Stores) == 3
		})
		return leader
	}
	first := healthy("a leader, 2 workers running, recovery complete, 3 stores, shard 1 at 3/3")

	// An observer reads what the leader projected, and the lease.
	obs := c.connAs(natsserver.RoleObserver)
	lg := c.openLogWith(obs, natslog.Config{Cluster: cluster, Bind: true})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// The cluster keeps appending (leader observations, health); compare
	// the observer's fold with the replicas' at the same seq.
	var st, want *projections.State
	testkit.Eventually(t, 20*time.Second, "the observer's load at the replicas' seq", func() bool {
		var err error
		if st, err = view.Load(ctx, lg); err != nil {
			t.Fatalf("observer load: %v", err)
		}
		want = converged(t, lg, m1, m2)
		return st.Seq == want.Seq
	})
	if st.Hash() != want.Hash() {
		t.Fatalf("observer read seq %d hash %s, replicas have seq %d hash %s", st.Seq, st.Hash(), want.Seq, want.Hash())
	}
	// The leader stored snapshots (meta role); an observer and a store
	// start from the newest and fold the same state.
	want = converged(t, lg, m1, m2)
	for _, role := range []natsserver.Role{natsserver.RoleObserver, natsserver.RoleStore} {
		nc := obs
		if role == natsserver.RoleStore {
			nc = c.connAs(role)
		}
		rl := c.openLogWith(nc, natslog.Config{Cluster: cluster, Bind: true})
		snaps, err := natslog.BindSnapshots(ctx, rl)
		if err != nil {
			t.Fatalf("%s binds the snapshot bucket: %v", role, err)
		}
		st, origin, err := view.LoadFrom(ctx, rl, snaps, testkit.Logger(t), nil)
		if err != nil {
			t.Fatalf("%s loads from a snapshot: %v", role, err)
		}
		if origin.Snapshot == nil || st.Seq < want.Seq {
			t.Fatalf("%s: origin %+v at seq %d, want a snapshot and seq >= %d", role, origin, st.Seq, want.Seq)
		}
		if ref := converged(t, lg, m1, m2); st.Seq == ref.Seq && st.Hash() != ref.Hash() {
			t.Fatalf("%s from snapshot %d: hash %s, replicas %s at seq %d", role, origin.Snapshot.Seq, st.Hash(), ref.Hash(), ref.Seq)
		}
	}
	holder := leaseHolder(t, obs)
	if holder != first.ID() {
		t.Fatalf("observer read lease holder %q, leader is %s", holder, first.ID())
	}

	// The operator RPC (admin) hands over: the leader releases the lease
	// (a KV purge) and the other meta acquires it.
	if rep, err := rpc(c.conn(), client.RPCStepDown, []byte("{}")); err != nil || rep.Error != nil {
		t.Fatalf("stepdown: %v %v", err, rep.Error)
	}
	testkit.Eventually(t, 30*time.Second, "the other meta leads", func() bool {
		l, _ := leaderOf(m1, m2)
		return l != nil && l != first
	})
	second := healthy("healthy again under the new leader")
	if second == first {
		t.Fatalf("leader did not change")
	}
	if v := c.violations(); len(v) > 0 {
		t.Fatalf("the roles needed more than their permissions:\n%s", strings.Join(v, "\n"))
	}
}

// leaseHolder reads the lease key as nc's user.
func leaseHolder(t *testing.T, nc *nats.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, meta.LeaseBucket(cluster))
	if err != nil {
		t.Fatalf("bind lease bucket: %v", err)
	}
	e, err := kv.Get(ctx, meta.LeaseKey)
	if err != nil {
		t.Fatalf("get lease: %v", err)
	}
	return string(e.Value())
}

// permFixture is a secure server holding a few events and a held lease,
// with nothing running that changes them: whatever changes them in a test
// is the connection under test.
type permFixture struct {
	c     *cluster_
	admin *natslog.Log
	lease jetstream.KeyValue
}

func newPermFixture(t *testing.T) *permFixture {
	t.Helper()
	c := newSecureCluster(t)
	lg := c.openLog(c.conn())
	forceAppend(t, lg, events.Event{Term: 1, Writer: "meta-1", At: time.Now(), Data: events.TermStarted{Term: 1, Leader: "meta-1"}})
	forceAppend(t, lg, events.Event{Term: 1, Writer: "meta-1", At: time.Now(), Data: events.StoreRegistered{Store: "store-1", Incarnation: "i", RaftAddr: "127.0.0.1:1"}})
	js, err := jetstream.New(c.conn())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: meta.LeaseBucket(cluster), History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, meta.LeaseKey, []byte("meta-1")); err != nil {
		t.Fatal(err)
	}
	return &permFixture{c: c, admin: lg, lease: kv}
}

// state is what a denied operation must leave as it was.
type permState struct {
	last, msgs uint64
	leaseRev   uint64
	lease      string
}

func (f *permFixture) state(t *testing.T) permState {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(f.c.conn())
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, natslog.StreamName(cluster))
	if err != nil {
		t.Fatalf("the event stream: %v", err)
	}
	e, err := f.lease.Get(ctx, meta.LeaseKey)
	if err != nil {
		t.Fatalf("the lease: %v", err)
	}
	info := st.CachedInfo()
	return permState{last: info.State.LastSeq, msgs: info.State.Msgs, leaseRev: e.Revision(), lease: string(e.Value())}
}

// watchedConn connects as role and collects the server's async errors.
func (f *permFixture) watchedConn(role natsserver.Role) (*nats.Conn, <-chan error) {
	errs := make(chan error, 64)
	nc := f.c.connAs(role, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	return nc, errs
}

// denied waits for the server's permissions violation naming op ("Publish"
// or "Subscription") to subject.
func denied(t *testing.T, errs <-chan error, op, subject string) {
	t.Helper()
	want := fmt.Sprintf("%s to %q", op, subject)
	timeout := time.After(10 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), want) {
				return
			}
			t.Logf("other async error: %v", err)
		case <-timeout:
			t.Fatalf("the server did not deny %s", want)
		}
	}
}

// tryPublish publishes body to subject and waits for the server's denial.
// A request (with a reply subject) is what the JetStream API and a
// JetStream publish send.
func tryPublish(t *testing.T, nc *nats.Conn, errs <-chan error, subject string, body []byte) {
	t.Helper()
	if err := nc.PublishRequest(subject, nc.NewRespInbox(), body); err != nil {
		t.Fatalf("publish %s: %v", subject, err)
	}
	denied(t, errs, "Publish", subject)
}

// trySubscribe subscribes to subject and waits for the server's denial.
func trySubscribe(t *testing.T, nc *nats.Conn, errs <-chan error, subject string) {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatalf("subscribe %s: %v", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	denied(t, errs, "Subscription", subject)
}

// writesDenied checks that nc cannot append events, write the lease, or
// delete, purge, create or update the stream or the lease bucket, and that
// the stream and the lease are unchanged afterwards.
func (f *permFixture) writesDenied(t *testing.T, nc *nats.Conn, errs <-chan error) {
	t.Helper()
	before := f.state(t)
	stream := natslog.StreamName(cluster)
	kvStream := "KV_" + meta.LeaseBucket(cluster)
	forged, err := events.Encode(events.Event{Term: 99, Writer: "forger", At: time.Now(), Data: events.TermStarted{Term: 99, Leader: "forger"}})
	if err != nil {
		t.Fatal(err)
	}
	// A JetStream publish of an event, with the CAS header, through the
	// ordinary client API: refused (the client sees no ack).
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	_, perr := js.PublishMsg(ctx, &nats.Msg{Subject: cluster + ".ev.term.started", Data: forged},
		jetstream.WithExpectLastSequence(before.last))
	cancel()
	if perr == nil {
		t.Fatalf("a JetStream publish of an event was acked")
	}
	denied(t, errs, "Publish", cluster+".ev.term.started")
	tryPublish(t, nc, errs, cluster+".ev.worker.registered", forged)
	// The lease: a put and a create are publishes to the key's subject.
	leaseSubj := "$KV." + meta.LeaseBucket(cluster) + "." + meta.LeaseKey
	tryPublish(t, nc, errs, leaseSubj, []byte("forger"))
	if err := nc.PublishMsg(&nats.Msg{Subject: leaseSubj, Data: []byte("forger"),
		Header: nats.Header{"Nats-Expected-Last-Subject-Sequence": []string{"0"}}}); err != nil {
		t.Fatal(err)
	}
	denied(t, errs, "Publish", leaseSubj)
	for _, api := range []string{
		"STREAM.DELETE." + stream, "STREAM.PURGE." + stream, "STREAM.UPDATE." + stream, "STREAM.CREATE.OTHER",
		"STREAM.MSG.DELETE." + stream,
		"STREAM.DELETE." + kvStream, "STREAM.PURGE." + kvStream, "STREAM.UPDATE." + kvStream,
	} {
		body := []byte("{}")
		if strings.HasPrefix(api, "STREAM.CREATE.") || strings.HasPrefix(api, "STREAM.UPDATE.") {
			name := strings.TrimPrefix(strings.TrimPrefix(api, "STREAM.CREATE."), "STREAM.UPDATE.")
			body, _ = json.Marshal(jetstream.StreamConfig{Name: name, Subjects: []string{cluster + ".ev.>"}, MaxMsgs: 1})
		}
		tryPublish(t, nc, errs, "$JS.API."+api, body)
	}
	if after := f.state(t); after != before {
		t.Fatalf("a denied connection changed the stream or the lease: %+v -> %+v", before, after)
	}
}

func TestPermWorkerDenied(t *testing.T) {
	f := newPermFixture(t)
	nc, errs := f.watchedConn(natsserver.RoleWorker)
	f.writesDenied(t, nc, errs)
	// Nor may it read the stream or the lease, or serve or snoop on
	// another role's subjects.
	tryPublish(t, nc, errs, "$JS.API.STREAM.INFO."+natslog.StreamName(cluster), nil)
	tryPublish(t, nc, errs, "$JS.API.CONSUMER.CREATE."+natslog.StreamName(cluster)+".snoop", nil)
	tryPublish(t, nc, errs, client.ExecSubject(cluster, "store-1"), []byte("{}"))
	tryPublish(t, nc, errs, client.RPCSubject(cluster, client.RPCStepDown), []byte("{}"))
	tryPublish(t, nc, errs, client.RPCSubject(cluster, client.RPCStoreDrain), []byte("{}"))
	trySubscribe(t, nc, errs, cluster+".rpc.>")
	trySubscribe(t, nc, errs, client.RPCSubject(cluster, client.RPCRegister))
	trySubscribe(t, nc, errs, client.ExecSubject(cluster, "store-1"))
	trySubscribe(t, nc, errs, cluster+".ev.>")
	trySubscribe(t, nc, errs, "_INBOX.>")
}

func TestPermStoreDenied(t *testing.T) {
	f := newPermFixture(t)
	nc, errs := f.watchedConn(natsserver.RoleStore)
	f.writesDenied(t, nc, errs)
	tryPublish(t, nc, errs, client.RPCSubject(cluster, client.RPCRegister), []byte("{}"))
	tryPublish(t, nc, errs, client.RPCSubject(cluster, client.RPCStepDown), []byte("{}"))
	tryPublish(t, nc, errs, "$JS.API.STREAM.INFO.KV_"+meta.LeaseBucket(cluster), nil)
	trySubscribe(t, nc, errs, cluster+".rpc.>")
	trySubscribe(t, nc, errs, "_INBOX.>")
	// A store reads the stream: its projection needs it.
	lg := f.c.openLogWith(nc, natslog.Config{Cluster: cluster, Bind: true})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if st, err := view.Load(ctx, lg); err != nil || st.Seq != 2 {
		t.Fatalf("store reads the stream: seq %d, %v", st.Seq, err)
	}
}

func TestPermObserverReadsOnly(t *testing.T) {
	f := newPermFixture(t)
	nc, errs := f.watchedConn(natsserver.RoleObserver)
	lg := f.c.openLogWith(nc, natslog.Config{Cluster: cluster, Bind: true})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	st, err := view.Load(ctx, lg)
	if err != nil {
		t.Fatalf("observer load: %v", err)
	}
	if st.Seq != 2 || len(st.Stores) != 1 || st.Term != 1 {
		t.Fatalf("observer read seq %d term %d stores %d, want 2, 1, 1", st.Seq, st.Term, len(st.Stores))
	}
	if h := leaseHolder(t, nc); h != "meta-1" {
		t.Fatalf("observer read lease %q", h)
	}
	f.writesDenied(t, nc, errs)
	tryPublish(t, nc, errs, client.RPCSubject(cluster, client.RPCStepDown), []byte("{}"))
	trySubscribe(t, nc, errs, cluster+".rpc.>")
	trySubscribe(t, nc, errs, "_INBOX.>")
	// Opening the log without Bind would create the stream if missing:
	// the observer may not, so it only binds.
	tryPublish(t, nc, errs, "$JS.API.STREAM.CREATE."+natslog.StreamName(cluster), []byte("{}"))
}

func TestPermMetaCannotDestroy(t *testing.T) {
	f := newPermFixture(t)
	nc, errs := f.watchedConn(natsserver.RoleMeta)
	before := f.state(t)
	for _, api := range []string{"STREAM.DELETE.", "STREAM.PURGE.", "STREAM.UPDATE.", "STREAM.MSG.DELETE."} {
		tryPublish(t, nc, errs, "$JS.API."+api+natslog.StreamName(cluster), []byte("{}"))
	}
	tryPublish(t, nc, errs, "$JS.API.STREAM.DELETE.KV_"+meta.LeaseBucket(cluster), nil)
	trySubscribe(t, nc, errs, "_INBOX.>")
	if after := f.state(t); after != before {
		t.Fatalf("meta changed the stream or the lease: %+v -> %+v", before, after)
	}
}

// TestPermUnknownUsersRefused: no credentials, or a key the server does not
// know, cannot connect at all.
func TestPermUnknownUsersRefused(t *testing.T) {
	f := newPermFixture(t)
	url := f.c.srv.ClientURL()
	if nc, err := nats.Connect(url, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("connected without credentials")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("without credentials: %v, want an authorization violation", err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	if nc, err := nats.Connect(url, nats.NoReconnect(), nats.Nkey(pub, kp.Sign)); err == nil {
		nc.Close()
		t.Fatal("connected with an unknown key")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("unknown key: %v, want an authorization violation", err)
	}
}

// TestPermTLS: with TLS, a client that trusts the generated CA connects and
// reads; a plaintext client is refused, and so is one that does not trust
// the CA.
func TestPermTLS(t *testing.T) {
	dir := t.TempDir()
	auth, certs := filepath.Join(dir, "auth"), filepath.Join(dir, "tls")
	if _, err := natsserver.InitAuth(auth); err != nil {
		t.Fatal(err)
	}
	if _, err := natsserver.InitTLS(certs); err != nil {
		t.Fatal(err)
	}
	a, err := natsserver.LoadServerAuth(auth, cluster)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := natsserver.ServerTLSConfig(filepath.Join(certs, natsserver.TLSCertFile), filepath.Join(certs, natsserver.TLSKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster_{t: t, srvCfg: natsserver.ServerConfig{DataDir: t.TempDir(), Auth: a, TLS: tc}, auth: auth}
	c.startNATS()
	ca := nats.RootCAs(filepath.Join(certs, natsserver.TLSCAFile))

	lg := c.openLog(c.connAs(natsserver.RoleAdmin, ca))
	forceAppend(t, lg, events.Event{Term: 1, Writer: "meta-1", At: time.Now(), Data: events.TermStarted{Term: 1, Leader: "meta-1"}})
	obs := c.connAs(natsserver.RoleObserver, ca)
	if !obs.TLSRequired() {
		t.Fatal("the server does not require TLS")
	}
	if _, err := obs.TLSConnectionState(); err != nil {
		t.Fatalf("observer connection is not TLS: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if st, err := view.Load(ctx, c.openLogWith(obs, natslog.Config{Cluster: cluster, Bind: true})); err != nil || st.Seq != 1 {
		t.Fatalf("observer over TLS: seq %d, %v", st.Seq, err)
	}

	// Plaintext: the server says TLS is required and answers a plaintext
	// CONNECT with an error, never a PONG.
	u, err := url.Parse(c.srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	info, err := r.ReadString('\n')
	if err != nil || !strings.Contains(info, `"tls_required":true`) {
		t.Fatalf("server INFO %q (%v) does not require TLS", info, err)
	}
	if _, err := conn.Write([]byte("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")); err != nil {
		t.Fatal(err)
	}
	// The server expects a TLS handshake and hangs up on plaintext.
	if line, err := r.ReadString('\n'); err == nil && !strings.HasPrefix(line, "-ERR") {
		t.Fatalf("a plaintext client got %q", line)
	}

	// A client that does not trust the CA fails the handshake.
	seed, err := natsserver.RoleOptions(auth, natsserver.RoleObserver)
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect(c.srv.ClientURL(), append(seed, nats.NoReconnect())...); err == nil {
		nc.Close()
		t.Fatal("connected without trusting the CA")
	}
}

// TestEveryClientRPCGranted: each RPC a role's client sends is in that
// role's publish permissions, and the buckets its readers bind are
// readable (a new RPC or bucket without its grant fails here, not in
// production under role keys).
func TestEveryClientRPCGranted(t *testing.T) {
	granted := func(r natsserver.Role, subject string) bool {
		p := natsserver.Permissions(cluster, r, "UPUB")
		return p != nil && slices.Contains(p.Publish.Allow, subject)
	}
	// The admin key (stepdown, store drain) is unrestricted by design.
	if p := natsserver.Permissions(cluster, natsserver.RoleAdmin, "UPUB"); p != nil {
		t.Errorf("the admin role is restricted: %+v", p)
	}
	for role, rpcs := range map[natsserver.Role][]string{
		natsserver.RoleWorker: {client.RPCRegister, client.RPCActivate, client.RPCHeartbeat, client.RPCDeregister},
		natsserver.RoleStore:  {client.RPCStoreRegister, client.RPCStoreHeartbeat, client.RPCStoreSelfDrain},
	} {
		for _, rpc := range rpcs {
			if !granted(role, client.RPCSubject(cluster, rpc)) {
				t.Errorf("role %s may not send %s", role, client.RPCSubject(cluster, rpc))
			}
		}
	}
	// The store role may not drain or undrain other stores (the admin's RPC).
	if granted(natsserver.RoleStore, client.RPCSubject(cluster, client.RPCStoreDrain)) {
		t.Errorf("role store may send %s", client.RPCSubject(cluster, client.RPCStoreDrain))
	}
	// The leader serves the RPCs and calls the stores; a store serves its
	// exec subject.
	execs := strings.Replace(client.ExecSubject(cluster, "X"), "X", "*", 1)
	if p := natsserver.Permissions(cluster, natsserver.RoleMeta, "UKEY"); !slices.Contains(p.Subscribe.Allow, client.RPCSubject(cluster, ">")) ||
		!slices.Contains(p.Publish.Allow, execs) {
		t.Errorf("meta may not serve the RPCs or call the stores: %+v %+v", p.Subscribe, p.Publish)
	}
	if p := natsserver.Permissions(cluster, natsserver.RoleStore, "UKEY"); !slices.Contains(p.Subscribe.Allow, execs) {
		t.Errorf("a store may not serve its exec subject: %+v", p.Subscribe)
	}
	for _, r := range []natsserver.Role{natsserver.RoleMeta, natsserver.RoleObserver} {
		if !granted(r, "$JS.API.DIRECT.GET.KV_"+meta.HealthBucket(cluster)+".>") {
			t.Errorf("role %s may not read the health bucket %s", r, meta.HealthBucket(cluster))
		}
	}
}

// TestPermServerWatchProbes: the keys of the roles whose connections are
// watched with the JetStream probe (meta, store) may send it. A refused
// probe is not an error but silence (nats.go times the request out), so a
// key without the grant would move its connection every 10 s for ever.
// The worker's key may not: workers are watched by their meta replies.
func TestPermServerWatchProbes(t *testing.T) {
	c := newSecureCluster(t)
	for _, tc := range []struct {
		role     natsserver.Role
		answered bool
	}{
		{natsserver.RoleMeta, true},
		{natsserver.RoleStore, true},
		{natsserver.RoleWorker, false},
	} {
		probe, err := natslog.AccountInfoProbe(c.connAs(tc.role))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		err = probe(ctx)
		cancel()
		if (err == nil) != tc.answered {
			t.Errorf("%s key: probe error %v, want answered %v", tc.role, err, tc.answered)
		}
	}
}
