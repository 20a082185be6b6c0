package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

// The nodeloss group: a 3-node NATS cluster (three `termlog nats`
// processes on loopback, --sync always, so a node can be SIGKILLed like a
// crashed machine, or SIGTERMed like a planned stop), three meta replicas
// (R3 stream and lease), and side by side through each loss:
//
//   - raw: a plain JetStream publisher on its own R3 stream with the event
//     stream's configuration, its leader on the event stream leader's node,
//     one publish in flight at a time;
//   - termlog: a client appending through the meta leader (register then
//     deregister a worker, each one fenced append), one request in flight;
//   - the time no replica leads, whether the term changed;
//   - `termlog status` run again and again (the binary, as a user would):
//     the longest wait for an answer (exit 0 or 1), counting from the loss.
//
// Blackouts are the longest gap between two successful operations from one
// second before the loss until the cluster is whole again.
const (
	nlCluster  = "nl"
	nlRawName  = "NODELOSS_RAW"
	nlSettle   = 2 * time.Second  // steady traffic before each loss
	nlRecover  = 40 * time.Second // bound of one loss's recovery
	nlAttempt  = 500 * time.Millisecond
	nlStatusTO = 5 * time.Second
)

// NodeLossConfig sizes the nodeloss group. Zero fields take the defaults.
type NodeLossConfig struct {
	// Kills is the number of losses of each scenario (default 5).
	Kills int
	// PortBase, when set, puts the nodes' client ports at PortBase..+2 and
	// their route ports at PortBase+3..+5; 0 picks free ports.
	PortBase int
	// Binary is the termlog binary the nodes and status run as (default:
	// this executable).
	Binary string
}

// named reports whether --only names group (or one of its figures): the
// groups that run only when asked for.
func (c Config) named(group string) bool {
	for _, o := range c.Only {
		if groupOf(o) == group {
			return true
		}
	}
	return false
}

// wantsScenario reports whether the run selects the nodeloss scenario:
// "nodeloss" selects all, "nodeloss.<scenario>[.figure]" one.
func (c Config) wantsScenario(name string) bool {
	for _, o := range c.Only {
		if o == GroupNodeLoss || strings.HasPrefix(o+".", GroupNodeLoss+"."+name+".") {
			return true
		}
	}
	return false
}

// nodeloss scenarios: what is lost, and how.
var nlScenarios = []struct {
	name     string
	target   string // stream, lease, follower
	graceful bool
}{
	{"kill_stream_leader", "stream", false},
	{"kill_lease_leader", "lease", false},
	{"kill_follower", "follower", false},
	{"stop_stream_leader", "stream", true},
	{"stop_lease_leader", "lease", true},
	{"stop_follower", "follower", true},
}

// nlNode is one `termlog nats` process.
type nlNode struct {
	name        string
	port, cport int
	dir         string
	cmd         *exec.Cmd
	done        chan struct{}
}

// nlCluster is three nodes and what runs on them.
type nlNATS struct {
	bin    string
	nodes  []*nlNode
	routes string
	log    io.Writer
}

func (c *nlNATS) urls() string {
	var u []string
	for _, n := range c.nodes {
		u = append(u, fmt.Sprintf("nats://127.0.0.1:%d", n.port))
	}
	return strings.Join(u, ",")
}

// urlsFrom lists the URLs, node i first.
func (c *nlNATS) urlsFrom(i int) string {
	u := strings.Split(c.urls(), ",")
	return strings.Join(append(u[i%len(u):], u[:i%len(u)]...), ",")
}

func (c *nlNATS) start(n *nlNode) error {
	args := []string{"nats", "--insecure", "--name", n.name, "--port", fmt.Sprint(n.port), "--cluster-port", fmt.Sprint(n.cport),
		"--routes", c.routes, "--data", n.dir, "--sync", "always", "--server-log", "warn", "--log-format", "json"}
	cmd := exec.Command(c.bin, args...)
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", n.name, err)
	}
	n.cmd, n.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(n.done) }()
	return nil
}

// end signals the node and waits for its exit (SIGKILL after 30 s).
func (n *nlNode) end(sig syscall.Signal) {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(sig)
	select {
	case <-n.done:
	case <-time.After(30 * time.Second):
		_ = n.cmd.Process.Kill()
		<-n.done
	}
	n.cmd = nil
}

func (c *nlNATS) close() {
	for _, n := range c.nodes {
		n.end(syscall.SIGKILL)
	}
}

// nlPorts are the client and route ports: from base on (0: free ones).
func nlPorts(base int) ([]int, error) {
	out := make([]int, 6)
	for i := range out {
		if base > 0 {
			out[i] = base + i
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		out[i] = ln.Addr().(*net.TCPAddr).Port
		defer ln.Close()
	}
	return out, nil
}

// waitReady waits until JetStream answers through node n's URL.
func waitReady(ctx context.Context, n *nlNode) error {
	for {
		err := func() error {
			nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", n.port), nats.Timeout(time.Second), nats.NoReconnect())
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			actx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err = js.AccountInfo(actx)
			return err
		}()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: JetStream not answering: %w (%v)", n.name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// nlConn connects to every node, node i first, reconnecting forever and
// never buffering a publish while reconnecting, leaving a node in lame-duck
// mode at once (as termlog's roles do).
func (c *nlNATS) conn(i int, name string, extra ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(c.urlsFrom(i), append([]nats.Option{nats.Name(name), nats.Timeout(2 * time.Second), nats.DontRandomize(),
		nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond), nats.ReconnectBufSize(-1),
		natsserver.MoveOnLameDuck()}, extra...)...)
}

// streamGroup is who leads a stream, and whether every replica is current.
func streamGroup(ctx context.Context, js jetstream.JetStream, name string) (leader string, whole bool, err error) {
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := js.Stream(actx, name)
	if err != nil {
		return "", false, err
	}
	ci := st.CachedInfo().Cluster
	if ci == nil {
		return "", false, errors.New("no cluster info")
	}
	whole = ci.Leader != "" && len(ci.Replicas) == 2
	for _, p := range ci.Replicas {
		if !p.Current || p.Offline {
			whole = false
		}
	}
	return ci.Leader, whole, nil
}

// stepDownTo asks the stream's leader to hand over to server and waits
// until it has.
func stepDownTo(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, stream, server string) error {
	for {
		l, _, err := streamGroup(ctx, js, stream)
		if err == nil && l == server {
			return nil
		}
		if err == nil && l != "" {
			req := fmt.Sprintf(`{"placement":{"preferred":%q}}`, server)
			_, _ = nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(req), 2*time.Second)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("move the leader of %s to %s: %w (leader %q, %v)", stream, server, ctx.Err(), l, err)
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// opLog records when operations succeeded, and when and why they failed.
type opLog struct {
	mu    sync.Mutex
	oks   []time.Time
	fails []opFail
}

// opFail is one failed operation: when it ended and why.
type opFail struct {
	at  time.Time
	err string
}

func (o *opLog) ok(t time.Time) { o.mu.Lock(); o.oks = append(o.oks, t); o.mu.Unlock() }
func (o *opLog) fail(err error) {
	o.mu.Lock()
	o.fails = append(o.fails, opFail{time.Now(), err.Error()})
	o.mu.Unlock()
}

// gap is the longest time between two successes (or from the window's
// start to the first, or the last to its end) within [from, to].
func (o *opLog) gap(from, to time.Time) time.Duration {
	g, _ := o.longest(from, to)
	return g
}

// longest is gap, and when it started.
func (o *opLog) longest(from, to time.Time) (time.Duration, time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	prev := from
	var worst time.Duration
	var at time.Time
	for _, t := range o.oks {
		if t.Before(from) {
			continue
		}
		if t.After(to) {
			break
		}
		if d := t.Sub(prev); d > worst {
			worst, at = d, prev
		}
		prev = t
	}
	if d := to.Sub(prev); d > worst {
		worst, at = d, prev
	}
	return worst, at
}

// gapWhy says where the longest gap of [from, to] lies relative to t0 and
// what failed inside it (each distinct error once, with the time of its
// first failure): what a blackout consists of.
func (o *opLog) gapWhy(from, to, t0 time.Time) string {
	g, at := o.longest(from, to)
	o.mu.Lock()
	defer o.mu.Unlock()
	var parts []string
	seen := map[string]bool{}
	for _, f := range o.fails {
		if f.at.Before(at) || f.at.After(at.Add(g)) || seen[f.err] {
			continue
		}
		seen[f.err] = true
		parts = append(parts, fmt.Sprintf("%+dms %s", f.at.Sub(t0).Milliseconds(), f.err))
	}
	why := "nothing failed"
	if len(parts) > 0 {
		why = strings.Join(parts, "; ")
	}
	return fmt.Sprintf("%+dms..%+dms (%s)", at.Sub(t0).Milliseconds(), at.Add(g).Sub(t0).Milliseconds(), why)
}

// okAfter reports whether an operation succeeded after t.
func (o *opLog) okAfter(t time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.oks) > 0 && o.oks[len(o.oks)-1].After(t)
}

// statusRun is one run of `termlog status`.
type statusRun struct {
	start, end time.Time
	code       int
	msg        string // the last line of a failed run's stderr
}

type statusLog struct {
	mu   sync.Mutex
	runs []statusRun
}

func (s *statusLog) add(r statusRun) { s.mu.Lock(); s.runs = append(s.runs, r); s.mu.Unlock() }

// median is the median time of the answered runs within [from, to].
func (s *statusLog) median(from, to time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ds []time.Duration
	for _, r := range s.runs {
		if !r.start.Before(from) && !r.end.After(to) && (r.code == 0 || r.code == 1) {
			ds = append(ds, r.end.Sub(r.start))
		}
	}
	return percentile(ds, 50)
}

// wait is the longest anyone asking status in [from, to] waited for an
// answer (exit 0 or 1): an answered run's own time, or, after runs that
// failed (exit 2) or hung, from the first of them to the end of the next
// answered run (or to, if none answered). It also returns how many runs
// failed and the last failure's message.
func (s *statusLog) wait(from, to time.Time) (time.Duration, int, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var worst time.Duration
	failed := 0
	var streak time.Time // the start of the failed runs since the last answer
	msg := ""
	for _, r := range s.runs {
		if r.end.Before(from) || r.start.After(to) {
			continue
		}
		if r.code != 0 && r.code != 1 {
			failed++
			msg = r.msg
			if streak.IsZero() {
				streak = later(r.start, from)
			}
			continue
		}
		begin := r.start
		if !streak.IsZero() {
			begin = streak
		}
		worst = max(worst, r.end.Sub(begin))
		streak = time.Time{}
	}
	if !streak.IsZero() {
		worst = max(worst, to.Sub(streak))
	}
	return worst, failed, msg
}

// nlSample is what one loss did.
type nlSample struct {
	raw, appends, noLeader, status time.Duration
	statusSteady                   time.Duration // median status run before the loss
	statusFailed                   int
	statusMsg                      string // the last failed status run's error
	termChanged                    bool
	victim                         string
	alsoLed                        []string // what else the victim led
	// When a surviving node first named a new leader of the event stream,
	// the lease bucket and the raw stream, since the loss; the ones never
	// seen ("stream", "lease", "raw") count as the window's end.
	elStream, elLease, elRaw time.Duration
	elUnseen                 []string
	// Where the longest raw and termlog gaps lay, and what failed in them.
	rawWhy, appendsWhy string
}

// nodeLoss runs the nodeloss group.
func (r *run) nodeLoss(ctx context.Context) error {
	bin := r.cfg.NodeLoss.Binary
	if bin == "" {
		var err error
		if bin, err = os.Executable(); err != nil {
			return err
		}
	}
	kills := r.cfg.NodeLoss.Kills
	if kills <= 0 {
		kills = 5
	}
	dir := filepath.Join(r.dir, "nodeloss")
	logf, err := os.Create(filepath.Join(r.dir, "nodeloss-nats.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	ports, err := nlPorts(r.cfg.NodeLoss.PortBase)
	if err != nil {
		return err
	}
	c := &nlNATS{bin: bin, log: logf}
	var routes []string
	for i := range 3 {
		n := &nlNode{name: fmt.Sprintf("nats-%d", i+1), port: ports[i], cport: ports[3+i], dir: filepath.Join(dir, fmt.Sprintf("nats-%d", i+1))}
		c.nodes = append(c.nodes, n)
		routes = append(routes, natsserver.RouteURL(n.cport))
	}
	c.routes = strings.Join(routes, ",")
	defer c.close()
	for _, n := range c.nodes {
		if err := c.start(n); err != nil {
			return err
		}
	}
	sctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer cancel()
	for _, n := range c.nodes {
		if err := waitReady(sctx, n); err != nil {
			return err
		}
	}
	r.progress("nodeloss: 3 NATS nodes (termlog nats, --sync always) at %s", c.urls())

	// The raw stream: the event stream's configuration, another name.
	obs, err := c.conn(0, "nodeloss-observer")
	if err != nil {
		return err
	}
	defer obs.Close()
	ojs, err := jetstream.New(obs)
	if err != nil {
		return err
	}
	rawCfg := natslog.StreamConfig(natslog.Config{Cluster: "nlraw", Replicas: 3})
	rawCfg.Name = nlRawName
	if err := natslog.AskAgain(sctx, obs, 5*time.Second, func(ctx context.Context) error {
		_, err := ojs.CreateOrUpdateStream(ctx, rawCfg)
		return err
	}); err != nil {
		return fmt.Errorf("raw stream: %w", err)
	}
	rawSubj := strings.TrimSuffix(rawCfg.Subjects[0], ">") + "raw"

	// Three meta replicas, meta-i connected to node i first; their logs
	// go to nodeloss-meta.log, to take a blackout apart afterwards.
	metaLog, err := os.Create(filepath.Join(r.dir, "nodeloss-meta.log"))
	if err != nil {
		return err
	}
	defer metaLog.Close()
	var metas []*metaNode
	defer func() { stopAll(metas) }()
	for i := range 3 {
		id := fmt.Sprintf("meta-%d", i+1)
		var replica atomic.Pointer[meta.Replica]
		nc, err := c.conn(i, id, nats.LameDuckModeHandler(func(nc *nats.Conn) { // as termlog meta run does
			if r := replica.Load(); r != nil {
				r.ServerLeaving(nc)
				return
			}
			_ = nc.ForceReconnect()
		}))
		if err != nil {
			return err
		}
		octx, ocancel := context.WithTimeout(sctx, 60*time.Second)
		rep, err := meta.Open(octx, nc, meta.Config{
			// With the health record, as in production: status answers
			// from its copy while the stream elects a leader.
			ID: id, Cluster: nlCluster, LeaseTTL: r.cfg.Lease, Replicas: 3,
			WorkerTimeout: workerTimeout, ExpiryInterval: expiryInterval, ControlDialer: dialAgent,
			Logger: zerolog.New(metaLog).Level(zerolog.InfoLevel).With().Timestamp().Str("replica", id).Logger(),
			Wait: func(ctx context.Context, _ string, open func(context.Context) error) error {
				return natslog.AskAgain(ctx, nc, 5*time.Second, open)
			},
		})
		ocancel()
		if err != nil {
			nc.Close()
			return fmt.Errorf("%s: %w", id, err)
		}
		replica.Store(rep)
		rctx, rcancel := context.WithCancel(context.Background())
		m := &metaNode{Replica: rep, nc: nc, cancel: rcancel, done: make(chan struct{})}
		go func() { defer close(m.done); _ = rep.Run(rctx) }()
		metas = append(metas, m)
	}
	if err := poll(sctx, 10*time.Millisecond, func() bool { l, _ := leaderOf(metas); return l != nil }); err != nil {
		return fmt.Errorf("no meta leader: %w", err)
	}
	l, term := leaderOf(metas)
	r.progress("nodeloss: %s leads term %d; %d losses per scenario", l.ID(), term, kills)

	// The loads run for the whole group; each loss reads its window.
	lctx, lcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { lcancel(); wg.Wait() }()
	var raw, apps opLog
	var status statusLog
	var leaderless struct {
		mu    sync.Mutex
		spans [][2]time.Time
	}
	rawNC, err := c.conn(1, "nodeloss-raw")
	if err != nil {
		return err
	}
	defer rawNC.Close()
	rawJS, err := jetstream.New(rawNC)
	if err != nil {
		return err
	}
	wg.Go(func() {
		for lctx.Err() == nil {
			actx, acancel := context.WithTimeout(lctx, nlAttempt)
			_, err := rawJS.Publish(actx, rawSubj, []byte(`{"v":1,"term":1,"writer":"raw","type":"raw","data":{}}`))
			acancel()
			if err == nil {
				raw.ok(time.Now())
			} else {
				raw.fail(err)
				sleepCtx(lctx, 10*time.Millisecond)
			}
		}
	})
	appNC, err := c.conn(2, "nodeloss-appender")
	if err != nil {
		return err
	}
	defer appNC.Close()
	wg.Go(func() { appendLoad(lctx, appNC, &apps) })
	wg.Go(func() {
		var since time.Time
		for lctx.Err() == nil {
			now := time.Now()
			if l, _ := leaderOf(metas); l == nil {
				if since.IsZero() {
					since = now
				}
			} else if !since.IsZero() {
				leaderless.mu.Lock()
				leaderless.spans = append(leaderless.spans, [2]time.Time{since, now})
				leaderless.mu.Unlock()
				since = time.Time{}
			}
			sleepCtx(lctx, 5*time.Millisecond)
		}
	})
	wg.Go(func() {
		for lctx.Err() == nil {
			start := time.Now()
			sc, scancel := context.WithTimeout(lctx, nlStatusTO+5*time.Second)
			cmd := exec.CommandContext(sc, bin, "status", "-o", "json", "--nats", c.urls(), "--cluster", nlCluster, "--replicas", "3",
				"--timeout", nlStatusTO.String())
			var stderr strings.Builder
			cmd.Stdout, cmd.Stderr = io.Discard, &stderr
			err := cmd.Run()
			scancel()
			code := 0
			var ee *exec.ExitError
			switch {
			case errors.As(err, &ee):
				code = ee.ExitCode()
			case err != nil:
				code = -1
			}
			if lctx.Err() != nil {
				return
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			status.add(statusRun{start: start, end: time.Now(), code: code, msg: lines[len(lines)-1]})
			sleepCtx(lctx, 100*time.Millisecond)
		}
	})
	noLeader := func(from, to time.Time) time.Duration {
		leaderless.mu.Lock()
		defer leaderless.mu.Unlock()
		var worst time.Duration
		for _, s := range leaderless.spans {
			if s[1].Before(from) || s[0].After(to) {
				continue
			}
			worst = max(worst, s[1].Sub(s[0]))
		}
		return worst
	}

	for _, sc := range nlScenarios {
		if !r.cfg.wantsScenario(sc.name) {
			continue
		}
		var samples []nlSample
		for k := range kills {
			s, err := r.nodeLossOnce(ctx, c, obs, ojs, metas, sc.target, sc.graceful, &raw, &apps, &status, noLeader)
			if err != nil {
				return fmt.Errorf("%s #%d: %w", sc.name, k+1, err)
			}
			r.progress("nodeloss: %s #%d (%s%s): raw %s, termlog %s, no leader %s, term changed %v, status %s (%d unanswered); %s", sc.name, k+1, s.victim,
				alsoLed(s.alsoLed), s.raw.Round(time.Millisecond), s.appends.Round(time.Millisecond), s.noLeader.Round(time.Millisecond), s.termChanged,
				s.status.Round(time.Millisecond), s.statusFailed, s.elections())
			r.progress("nodeloss: %s #%d: longest gaps since the loss: termlog %s; raw %s", sc.name, k+1, s.appendsWhy, s.rawWhy)
			if s.statusMsg != "" {
				r.progress("nodeloss: %s #%d: status failed with: %s", sc.name, k+1, s.statusMsg)
			}
			samples = append(samples, s)
		}
		r.addNodeLoss(sc.name, sc.target, sc.graceful, samples)
	}
	return nil
}

func alsoLed(l []string) string {
	if len(l) == 0 {
		return ""
	}
	return ", leading " + strings.Join(l, "+")
}

func sleepCtx(ctx context.Context, d time.Duration) { clock.Sleep(ctx, clock.Real{}, d) }

// appendLoad appends through the meta leader, one request at a time:
// register a worker, then deregister it (each one fenced append).
func appendLoad(ctx context.Context, nc *nats.Conn, apps *opLog) {
	call := func(rpc string, req any) (client.Reply, error) {
		b, _ := json.Marshal(req)
		m, err := nc.Request(client.RPCSubject(nlCluster, rpc), b, nlAttempt)
		if err != nil {
			return client.Reply{}, err
		}
		var rep client.Reply
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			return rep, err
		}
		if rep.Error != nil {
			return rep, errors.New(rep.Error.Message)
		}
		return rep, nil
	}
	for i := 0; ctx.Err() == nil; i++ {
		inc := fmt.Sprintf("nodeloss-%d", i)
		rep, err := call(client.RPCRegister, client.RegisterRequest{Incarnation: inc, Endpoint: fakeEndpoint(i % 50000), Kind: "compute", Parallelism: 1})
		if err != nil {
			apps.fail(fmt.Errorf("register: %w", err))
			sleepCtx(ctx, 10*time.Millisecond)
			continue
		}
		apps.ok(time.Now())
		for ctx.Err() == nil {
			_, err := call(client.RPCDeregister, client.WorkerRef{ID: rep.ID, Epoch: rep.Epoch, Incarnation: inc})
			if err == nil {
				apps.ok(time.Now())
				break
			}
			apps.fail(fmt.Errorf("deregister: %w", err))
			sleepCtx(ctx, 10*time.Millisecond)
		}
	}
}

// nodeLossOnce places the raw stream's leader with the event stream's,
// loses the target's node, waits until everything answers again, measures,
// then restarts the node and waits until every stream is whole.
func (r *run) nodeLossOnce(ctx context.Context, c *nlNATS, nc *nats.Conn, js jetstream.JetStream, metas []*metaNode, target string, graceful bool,
	raw, apps *opLog, status *statusLog, noLeader func(from, to time.Time) time.Duration) (nlSample, error) {
	var s nlSample
	pctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer cancel()
	evStream, leaseStream := natslog.StreamName(nlCluster), "KV_"+meta.LeaseBucket(nlCluster)
	// Whole, with a leader, every load answering.
	var evL, leaseL string
	err := poll(pctx, 100*time.Millisecond, func() bool {
		var w1, w2, w3 bool
		var err1, err2, err3 error
		evL, w1, err1 = streamGroup(pctx, js, evStream)
		leaseL, w2, err2 = streamGroup(pctx, js, leaseStream)
		_, w3, err3 = streamGroup(pctx, js, nlRawName)
		l, _ := leaderOf(metas)
		return err1 == nil && err2 == nil && err3 == nil && w1 && w2 && w3 && l != nil
	})
	if err != nil {
		return s, fmt.Errorf("cluster not whole before the loss: %w", err)
	}
	if err := stepDownTo(pctx, nc, js, nlRawName, evL); err != nil {
		return s, err
	}
	// Settle: the stream and lease leaders may move meanwhile (termlog may
	// move them itself); read them once the traffic is steady.
	time.Sleep(nlSettle)
	if evL, _, err = streamGroup(pctx, js, evStream); err != nil {
		return s, err
	}
	if leaseL, _, err = streamGroup(pctx, js, leaseStream); err != nil {
		return s, err
	}
	if rl, _, err := streamGroup(pctx, js, nlRawName); err != nil || rl != evL {
		if err := stepDownTo(pctx, nc, js, nlRawName, evL); err != nil {
			return s, err
		}
	}
	var victim *nlNode
	for _, n := range c.nodes {
		switch target {
		case "stream":
			if n.name == evL {
				victim = n
			}
		case "lease":
			if n.name == leaseL {
				victim = n
			}
		default:
			if n.name != evL && n.name != leaseL && victim == nil {
				victim = n
			}
		}
	}
	if victim == nil {
		return s, fmt.Errorf("no node to lose for %s (stream leader %s, lease leader %s)", target, evL, leaseL)
	}
	s.victim = victim.name
	if victim.name == evL && target != "stream" {
		s.alsoLed = append(s.alsoLed, "stream")
	}
	if victim.name == leaseL && target != "lease" {
		s.alsoLed = append(s.alsoLed, "lease")
	}
	if !apps.okAfter(time.Now().Add(-time.Second)) || !raw.okAfter(time.Now().Add(-time.Second)) {
		return s, errors.New("the loads are not running before the loss")
	}
	_, term0 := leaderOf(metas)
	// The elections, watched through a node that survives.
	survivor := 0
	for c.nodes[survivor] == victim {
		survivor++
	}
	wnc, err := c.conn(survivor, "nodeloss-elections")
	if err != nil {
		return s, err
	}
	t0 := time.Now()
	watch, err := watchElections(wnc, victim.name, t0, evStream, leaseStream, nlRawName)
	if err != nil {
		return s, err
	}
	s.statusSteady = status.median(t0.Add(-nlSettle-time.Second), t0)
	if graceful {
		victim.end(syscall.SIGTERM)
	} else {
		victim.end(syscall.SIGKILL)
	}
	// Recovered: both loads and status answered after the loss, and a replica leads.
	rctx, rcancel := context.WithTimeout(ctx, nlRecover)
	defer rcancel()
	err = poll(rctx, 20*time.Millisecond, func() bool {
		l, _ := leaderOf(metas)
		status.mu.Lock()
		answered := false
		for _, sr := range status.runs {
			if sr.start.After(t0) && (sr.code == 0 || sr.code == 1) {
				answered = true
			}
		}
		status.mu.Unlock()
		return l != nil && answered && raw.okAfter(t0.Add(time.Second)) && apps.okAfter(t0.Add(time.Second))
	})
	els, unseen := watch.stop(time.Now())
	s.elStream, s.elLease, s.elRaw = els[0], els[1], els[2]
	for i, name := range []string{"stream", "lease", "raw"} {
		if unseen[i] {
			s.elUnseen = append(s.elUnseen, name)
		}
	}
	if err != nil {
		r.progress("nodeloss: not recovered within %s of losing %s (raw ok %v, termlog ok %v)", nlRecover, victim.name, raw.okAfter(t0), apps.okAfter(t0))
	}
	time.Sleep(time.Second) // what the loss does late
	end := time.Now()
	from := t0.Add(-time.Second)
	s.raw, s.appends = raw.gap(from, end), apps.gap(from, end)
	s.rawWhy, s.appendsWhy = raw.gapWhy(from, end, t0), apps.gapWhy(from, end, t0)
	s.noLeader = noLeader(from, end)
	s.status, s.statusFailed, s.statusMsg = status.wait(t0, end)
	_, term1 := leaderOf(metas)
	s.termChanged = term1 != term0
	for _, m := range metas {
		for _, t := range m.Terms() {
			if t.Term > term0 {
				s.termChanged = true
			}
		}
	}
	if err := c.start(victim); err != nil {
		return s, err
	}
	if err := waitReady(pctx, victim); err != nil {
		return s, err
	}
	return s, nil
}

func (r *run) addNodeLoss(name, target string, graceful bool, ss []nlSample) {
	pick := func(f func(nlSample) time.Duration) (lo, med, hi time.Duration) { return spread(ss, f) }
	rawLo, rawMed, rawHi := pick(func(s nlSample) time.Duration { return s.raw })
	apLo, apMed, apHi := pick(func(s nlSample) time.Duration { return s.appends })
	nlLo, nlMed, nlHi := pick(func(s nlSample) time.Duration { return s.noLeader })
	stLo, stMed, stHi := pick(func(s nlSample) time.Duration { return s.status })
	_, steady, _ := pick(func(s nlSample) time.Duration { return s.statusSteady })
	_, _, stExHi := pick(func(s nlSample) time.Duration { return s.status - s.statusSteady })
	exLo, exMed, exHi := pick(func(s nlSample) time.Duration { return s.appends - s.raw })
	changed, failed := 0, 0
	var victims []string
	for _, s := range ss {
		if s.termChanged {
			changed++
		}
		failed += s.statusFailed
		victims = append(victims, s.victim+alsoLed(s.alsoLed))
	}
	how := "SIGKILL"
	if graceful {
		how = "SIGTERM (graceful stop)"
	}
	what := map[string]string{"stream": "the node leading the event stream", "lease": "the node leading the lease bucket", "follower": "a node leading neither"}[target]
	extra := map[string]float64{
		"kills": float64(len(ss)), "term_changes": float64(changed), "status_unanswered_runs": float64(failed),
		"raw_min_s": rawLo.Seconds(), "raw_max_s": rawHi.Seconds(),
		"append_min_s": apLo.Seconds(), "append_max_s": apHi.Seconds(),
		"excess_min_s": exLo.Seconds(), "excess_median_s": exMed.Seconds(), "excess_max_s": exHi.Seconds(),
		"no_leader_min_s": nlLo.Seconds(), "no_leader_median_s": nlMed.Seconds(), "no_leader_max_s": nlHi.Seconds(),
		"status_min_s": stLo.Seconds(), "status_median_s": stMed.Seconds(), "status_max_s": stHi.Seconds(),
	}
	for key, el := range map[string]func(nlSample) time.Duration{
		"elected_stream": func(s nlSample) time.Duration { return s.elStream },
		"elected_lease":  func(s nlSample) time.Duration { return s.elLease },
		"elected_raw":    func(s nlSample) time.Duration { return s.elRaw },
	} {
		lo, med, hi := pick(el)
		extra[key+"_min_s"], extra[key+"_median_s"], extra[key+"_max_s"] = lo.Seconds(), med.Seconds(), hi.Seconds()
	}
	f := Figure{
		Name: GroupNodeLoss + "." + name + ".append_blackout",
		What: fmt.Sprintf("%s of %s on a 3-node cluster (--sync always, R3): longest gap between fenced appends through the meta leader, median of %d (min %s, max %s; raw min %s, max %s; losses: %s)",
			how, what, len(ss), apLo.Round(time.Millisecond), apHi.Round(time.Millisecond), rawLo.Round(time.Millisecond), rawHi.Round(time.Millisecond), strings.Join(victims, "; ")),
		Unit: "s", Value: apMed.Seconds(), Baseline: rawMed.Seconds(),
		BaselineWhat: "longest gap between raw JetStream publishes on an R3 stream of the same configuration led by the event stream leader's node, through the same loss",
		Extra:        extra,
	}
	switch {
	case graceful:
		f.Target = &Target{Of: "value", Op: "<=", Limit: 1, Text: "<= 1 s"}
		f.Value = apHi.Seconds() // every stop, not the median
		f.What = strings.Replace(f.What, "median of", "max of", 1)
	case target != "follower":
		// termlog <= raw + 1 s, every loss: the excess is the figure.
		f.Name = GroupNodeLoss + "." + name + ".append_excess"
		f.What = fmt.Sprintf("%s of %s: termlog's append blackout minus the raw publish blackout of the same loss, max of %d (termlog median %s, raw median %s; losses: %s)",
			how, what, len(ss), apMed.Round(time.Millisecond), rawMed.Round(time.Millisecond), strings.Join(victims, "; "))
		f.Value, f.Baseline = exHi.Seconds(), 0
		f.BaselineWhat = "0 s: nothing on top of NATS's own blackout"
		f.Target = &Target{Of: "value", Op: "<=", Limit: 1, Text: "<= raw + 1 s"}
	}
	r.add(f)
	if !graceful && target != "follower" {
		r.add(nlOwnFigure(GroupNodeLoss+"."+name, how, what, ss))
	}
	r.add(Figure{
		Name: GroupNodeLoss + "." + name + ".no_leader", What: fmt.Sprintf("%s of %s: longest time no meta replica led, max of %d (median %s); the term changed in %d of %d",
			how, what, len(ss), nlMed.Round(time.Millisecond), changed, len(ss)),
		Unit: "s", Value: nlHi.Seconds(), Baseline: rawHi.Seconds(), BaselineWhat: "the longest raw publish blackout of the same losses",
		Extra: map[string]float64{"term_changes": float64(changed)},
	})
	if target == "follower" || graceful {
		tf := Figure{
			Name: GroupNodeLoss + "." + name + ".term_changes", What: fmt.Sprintf("%s of %s: losses after which the meta term had changed", how, what),
			Unit: "losses", Value: float64(changed), Baseline: math0, BaselineWhat: "none",
			Target: &Target{Of: "value", Op: "<=", Limit: 0, Text: "no term change"},
		}
		r.add(tf)
	}
	sf := Figure{
		Name: GroupNodeLoss + "." + name + ".status_wait", What: fmt.Sprintf("%s of %s: longest wait for `termlog status` (the binary, process start included) to answer (exit 0 or 1) from the loss on, max of %d (median %s; longest beyond a steady run %s); %d runs exited 2 or hung",
			how, what, len(ss), stMed.Round(time.Millisecond), stExHi.Round(time.Millisecond), failed),
		Unit: "s", Value: stHi.Seconds(), Baseline: steady.Seconds(), BaselineWhat: "the median status run in the seconds before the losses (this machine's cost of a status process)",
		Extra: map[string]float64{"status_min_s": stLo.Seconds(), "status_median_s": stMed.Seconds(), "status_excess_max_s": stExHi.Seconds(), "status_steady_s": steady.Seconds()},
	}
	// Within 1 s of a steady run, every loss (the Done-when line of a
	// leader's node crash; issue item 4 for every loss): the process's own
	// start and read are this machine's, not the election's.
	sf.Name = GroupNodeLoss + "." + name + ".status_excess"
	sf.Value, sf.Baseline = stExHi.Seconds(), 0
	sf.BaselineWhat = "0 s: as quick as a status run before the loss (" + steady.Round(time.Millisecond).String() + " here)"
	sf.Target = &Target{Of: "value", Op: "<=", Limit: 1, Text: "<= steady + 1 s throughout"}
	if failed > 0 {
		sf.Value = math.Max(sf.Value, stHi.Seconds()) // a run that failed is no answer
	}
	r.add(sf)

	clauses := doneWhen(target, graceful, ss)
	missed := 0
	var texts []string
	for _, c := range clauses {
		verdict := "MET"
		if !c.met {
			verdict, missed = "MISSED", missed+1
		}
		texts = append(texts, fmt.Sprintf("%s: %s (%s)", c.what, verdict, c.numbers))
	}
	r.add(Figure{
		Name: GroupNodeLoss + "." + name + ".done_when",
		What: fmt.Sprintf("%s of %s, the issue's Done-when lines over %d losses: %s", how, what, len(ss), strings.Join(texts, "; ")),
		Unit: "lines missed", Value: float64(missed), Baseline: 0, BaselineWhat: fmt.Sprintf("none missed (%d lines apply to this loss)", len(clauses)),
		Target: &Target{Of: "value", Op: "<=", Limit: 0, Text: "every line met"},
	})
}

// nlClause is one Done-when line of the issue as a loss's samples met it.
type nlClause struct {
	what, numbers string
	met           bool
}

// doneWhen judges the samples of one scenario (what was lost, how) by the
// issue's Done-when lines: a graceful stop of any node -> no term change
// and append blackout <= 1 s; a kill of the stream's or lease's leader's
// node -> termlog's append blackout <= the raw blackout + 1 s (every
// loss), status answers within 1 s throughout; a kill of a follower -> no
// term change. Status within 1 s (beyond a steady run; no run exiting 2)
// is judged on every loss (issue item 4), marked so where it is not a
// Done-when line.
func doneWhen(target string, graceful bool, ss []nlSample) []nlClause {
	var out []nlClause
	changed := 0
	var worstAppend, worstExcess, worstStatus time.Duration
	var excessAt nlSample
	failed := 0
	for i, s := range ss {
		if s.termChanged {
			changed++
		}
		worstAppend = max(worstAppend, s.appends)
		if ex := s.appends - s.raw; i == 0 || ex > worstExcess {
			worstExcess, excessAt = ex, s
		}
		worstStatus = max(worstStatus, s.status-s.statusSteady)
		failed += s.statusFailed
	}
	ms := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	noTermChange := nlClause{what: "no term change", numbers: fmt.Sprintf("changed in %d of %d", changed, len(ss)), met: changed == 0}
	status := nlClause{what: "status answers within 1 s throughout",
		numbers: fmt.Sprintf("longest beyond a steady run %s, %d runs exited 2", ms(worstStatus), failed), met: worstStatus <= time.Second && failed == 0}
	switch {
	case graceful:
		out = append(out, noTermChange, nlClause{what: "append blackout <= 1 s", numbers: "longest " + ms(worstAppend), met: worstAppend <= time.Second})
		status.what += " (item 4)"
	case target == "follower":
		out = append(out, noTermChange)
		status.what += " (item 4)"
	default:
		out = append(out, nlClause{what: "termlog's append blackout <= raw + 1 s",
			numbers: fmt.Sprintf("worst loss termlog %s vs raw %s, %+.2f s; %s", ms(excessAt.appends), ms(excessAt.raw), worstExcess.Seconds(), excessAt.elections()),
			met:     len(ss) > 0 && worstExcess <= time.Second})
	}
	return append(out, status)
}

// math0 is a baseline of nothing (its ratio is undefined).
const math0 = 0.0

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
