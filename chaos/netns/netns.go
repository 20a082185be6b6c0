// Package netns builds a small private network out of Linux network
// namespaces, for partition tests of real processes: one namespace per
// node, each with one interface (eth0) on a bridge that lives in a
// namespace of its own, addresses from 10.231.0.0/24 that exist only
// inside those namespaces. The root namespace's interfaces, addresses and
// routes are never touched.
//
// A partition is made with the neighbour table, not a firewall (the
// machines this runs on may have neither iptables nor nft nor tc actions):
// Cut(a, b) gives each side a permanent neighbour entry for the other's
// address with a MAC address nobody owns, so every frame between them is
// flooded by the bridge and dropped by everyone: silence, as in a real
// partition (no reset, no unreachable error; a connect times out, an open
// connection stalls). Heal deletes the entries; the next packet resolves
// the real address again.
//
// Everything needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN, for the
// namespaces' mounts) and the ip tool; Available says why not.
package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Subnet is the address range of every Net (each Net is its own island,
// so two Nets may use it at once).
const Subnet = "10.231.0.0/24"

// blackholeMAC is the MAC address a cut points a peer's address to: a
// locally administered unicast address that no interface has.
const blackholeMAC = "02:de:ad:00:00:01"

// prefix starts the name of every namespace this package creates, so a
// later run can find and remove what a killed one left behind.
const prefix = "tln"

// Available returns nil when this process can build namespaces, or the
// reason it cannot (for a test's Skip).
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root (CAP_NET_ADMIN and CAP_SYS_ADMIN); run the tests as root to include the partition scenarios")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("the ip tool (iproute2) is not installed: apt-get install iproute2")
	}
	name := fmt.Sprintf("%s%d-probe", prefix, os.Getpid())
	if out, err := addNS(context.Background(), name); err != nil {
		return fmt.Errorf("cannot create a network namespace (no CAP_NET_ADMIN/CAP_SYS_ADMIN here?): %v: %s", err, out)
	}
	if out, err := run(context.Background(), "ip", "-n", name, "link", "add", "br0", "type", "bridge"); err != nil {
		_, _ = run(context.Background(), "ip", "netns", "del", name)
		return fmt.Errorf("cannot create a bridge in a namespace: %v: %s", err, out)
	}
	if out, err := run(context.Background(), "ip", "netns", "del", name); err != nil {
		return fmt.Errorf("cannot delete network namespace %s: %v: %s", name, err, out)
	}
	return nil
}

// Net is one private network: a bridge namespace and node namespaces.
type Net struct {
	id     string // unique among this machine's Nets: prefix + pid + counter
	bridge string // the bridge's namespace

	mu    sync.Mutex
	nodes map[string]*Node
	order []string
	cuts  map[[2]string]int // sorted pairs -> how many Cuts hold them (Uncut releases one)
	done  bool
}

// Node is one namespace on a Net.
type Node struct {
	Name string // the caller's name
	NS   string // the namespace's name
	IP   string // its address on the bridge
	port string // the bridge-side end of its veth pair
}

var nets atomic.Uint64

// New creates a Net: its bridge namespace and bridge. It first removes
// namespaces left by runs of this package whose process is gone. Call
// Teardown when done (also after a failure).
func New(ctx context.Context) (*Net, error) {
	RemoveStale(ctx)
	n := &Net{id: fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), nets.Add(1)), nodes: map[string]*Node{}, cuts: map[[2]string]int{}}
	n.bridge = n.id + "-br"
	if out, err := addNS(ctx, n.bridge); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", n.bridge, err, bytes.TrimSpace(out))
	}
	for _, args := range [][]string{
		{"-n", n.bridge, "link", "add", "br0", "type", "bridge"},
		{"-n", n.bridge, "link", "set", "br0", "up"},
		{"-n", n.bridge, "link", "set", "lo", "up"},
	} {
		if err := n.ip(ctx, args...); err != nil {
			return nil, errors.Join(err, n.Teardown())
		}
	}
	return n, nil
}

// ID is the prefix of the Net's namespace names.
func (n *Net) ID() string { return n.id }

// Add creates a node: a namespace with loopback up and eth0 on the
// bridge at the next free address.
func (n *Net) Add(ctx context.Context, name string) (*Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done {
		return nil, errors.New("netns: Add after Teardown")
	}
	if _, dup := n.nodes[name]; dup {
		return nil, fmt.Errorf("netns: node %q exists", name)
	}
	if len(n.nodes) >= 250 {
		return nil, errors.New("netns: at most 250 nodes")
	}
	idx := len(n.order) + 1
	nd := &Node{Name: name, NS: fmt.Sprintf("%s-%d", n.id, idx), IP: fmt.Sprintf("10.231.0.%d", idx), port: fmt.Sprintf("p%d", idx)}
	if out, err := addNS(ctx, nd.NS); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", nd.NS, err, bytes.TrimSpace(out))
	}
	n.nodes[name] = nd
	n.order = append(n.order, name)
	for _, args := range [][]string{
		{"-n", nd.NS, "link", "set", "lo", "up"},
		// Both ends are created inside namespaces: the root namespace never
		// sees the pair.
		{"-n", nd.NS, "link", "add", "eth0", "type", "veth", "peer", "name", nd.port, "netns", n.bridge},
		{"-n", n.bridge, "link", "set", nd.port, "master", "br0"},
		{"-n", n.bridge, "link", "set", nd.port, "up"},
		{"-n", nd.NS, "addr", "add", nd.IP + "/24", "dev", "eth0"},
		{"-n", nd.NS, "link", "set", "eth0", "up"},
	} {
		if err := n.ip(ctx, args...); err != nil {
			return nil, err
		}
	}
	return nd, nil
}

// Node returns a node by name.
func (n *Net) Node(name string) (*Node, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	nd, ok := n.nodes[name]
	return nd, ok
}

// Exec is the command prefix that runs a program inside node's namespace:
// append the program and its arguments.
func (nd *Node) Exec() []string { return []string{"ip", "netns", "exec", nd.NS} }

// Command is exec.CommandContext of name and args inside node's namespace.
func (nd *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := append(nd.Exec()[1:], name)
	return exec.CommandContext(ctx, "ip", append(argv, args...)...)
}

// Cut stops all traffic between nodes a and b (both directions, silently)
// until Heal, or until as many Uncuts of the pair as Cuts of it: two
// overlapping faults that both cut a pair each release only their own.
func (n *Net) Cut(ctx context.Context, a, b string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut(ctx, a, b)
}

func (n *Net) cut(ctx context.Context, a, b string) error {
	na, nb := n.nodes[a], n.nodes[b]
	if na == nil || nb == nil || a == b {
		return fmt.Errorf("netns: cannot cut %q from %q: two different nodes of this net needed", a, b)
	}
	for _, p := range [][2]*Node{{na, nb}, {nb, na}} {
		if err := n.ip(ctx, "-n", p[0].NS, "neigh", "replace", p[1].IP, "lladdr", blackholeMAC, "dev", "eth0", "nud", "permanent"); err != nil {
			return err
		}
	}
	n.cuts[pair(a, b)]++
	return nil
}

// Uncut releases one Cut of a and b; the link works again once no Cut
// of the pair is left. Uncutting a pair that is not cut is a no-op.
func (n *Net) Uncut(ctx context.Context, a, b string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := pair(a, b)
	switch n.cuts[p] {
	case 0:
		return nil
	case 1:
		delete(n.cuts, p)
		return n.restore(ctx, p)
	}
	n.cuts[p]--
	return nil
}

// restore deletes the blackhole entries of a pair: the kernel resolves
// the real address again at the next packet.
func (n *Net) restore(ctx context.Context, p [2]string) error {
	a, b := n.nodes[p[0]], n.nodes[p[1]]
	var errs []error
	for _, q := range [][2]*Node{{a, b}, {b, a}} {
		if err := n.ip(ctx, "-n", q[0].NS, "neigh", "del", q[1].IP, "dev", "eth0"); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Isolate cuts node a from every other node (those added later too are
// not covered: isolate after adding them).
func (n *Net) Isolate(ctx context.Context, a string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.nodes[a] == nil {
		return fmt.Errorf("netns: no node %q", a)
	}
	for _, b := range n.order {
		if b != a {
			if err := n.cut(ctx, a, b); err != nil {
				return err
			}
		}
	}
	return nil
}

// Cuts lists the cut pairs, sorted.
func (n *Net) Cuts() [][2]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([][2]string, 0, len(n.cuts))
	for p := range n.cuts {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] || out[i][0] == out[j][0] && out[i][1] < out[j][1] })
	return out
}

// Heal removes every cut.
func (n *Net) Heal(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	var errs []error
	for p := range n.cuts {
		errs = append(errs, n.restore(ctx, p))
		delete(n.cuts, p)
	}
	return errors.Join(errs...)
}

// Teardown deletes every namespace of the Net (their interfaces go with
// them). It is safe to call more than once and after a failed New or Add.
// Processes still running inside a namespace keep its network alive
// until they exit: stop them first.
func (n *Net) Teardown() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.done = true
	return removeMatching(context.Background(), func(name string) bool {
		return name == n.bridge || strings.HasPrefix(name, n.id+"-")
	})
}

// RemoveStale deletes namespaces this package created in processes that
// are gone (a test binary killed before its Teardown).
func RemoveStale(ctx context.Context) {
	_ = removeMatching(ctx, func(name string) bool {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			return false
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() {
			return false
		}
		return !alive(pid)
	})
}

func alive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

// List names the namespaces on this machine that this package made.
func List(ctx context.Context) ([]string, error) {
	all, err := namespaces(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range all {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	return out, nil
}

func namespaces(ctx context.Context) ([]string, error) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, fmt.Errorf("ip netns list: %v: %s", err, out)
	}
	var names []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

func removeMatching(ctx context.Context, match func(string) bool) error {
	names, err := namespaces(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range names {
		if match(name) {
			if out, err := run(ctx, "ip", "netns", "del", name); err != nil {
				errs = append(errs, fmt.Errorf("ip netns del %s: %v: %s", name, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

func pair(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

func (n *Net) ip(ctx context.Context, args ...string) error {
	if out, err := run(ctx, "ip", args...); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// addNS runs `ip netns add name` holding a lock shared by every process
// of this package: the first namespace of a machine makes /run/netns a
// shared mount point, and two processes doing that at once could stack
// two mounts there (namespaces made under the lower one would vanish from
// view). Test binaries of several packages run at once.
func addNS(ctx context.Context, name string) ([]byte, error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "termlog-netns.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return run(ctx, "ip", "netns", "add", name)
}

// run runs a short command, bounded so a wedged tool cannot hang a test.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, name, args...).CombinedOutput()
}
