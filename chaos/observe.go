package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Everything here reads the cluster from the outside: the built binary's
// read commands (status, replay, replay export) and the processes' /metrics.

// CmdResult is one run of the binary.
type CmdResult struct {
	Args           []string
	Code           int
	Stdout, Stderr string
	Invoke, Return time.Time
}

// Run runs the binary with args against the cluster (bounded by ctx).
func (c *Cluster) Run(ctx context.Context, args ...string) (CmdResult, error) {
	r := CmdResult{Args: args}
	cmd := exec.CommandContext(ctx, c.Cfg.Bin, args...)
	if nd := c.Node(ClientNode); nd != nil {
		cmd = nd.Command(ctx, c.Cfg.Bin, args...)
	}
	cmd.Env = append(os.Environ(), c.env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	r.Invoke = time.Now()
	err := cmd.Run()
	r.Return = time.Now()
	r.Stdout, r.Stderr = out.String(), errOut.String()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ctx.Err() == nil:
		r.Code = ee.ExitCode()
	default:
		return r, fmt.Errorf("%v: %w", args, err)
	}
	return r, nil
}

// StatusWorker, StatusShard, StatusStore and Status are the parts of
// `status -o json` the checks read (its JSON is the contract, not the Go
// types behind it).
type StatusWorker struct {
	ID          uint64 `json:"id"`
	Epoch       uint64 `json:"epoch"`
	Incarnation string `json:"incarnation"`
	Endpoint    string `json:"endpoint"`
	State       string `json:"state"`
	Term        uint64 `json:"term"`
}

type StatusShard struct {
	ID       uint64            `json:"id"`
	Members  map[uint64]string `json:"members"`
	Removed  map[uint64]string `json:"removed,omitempty"`
	Pending  map[uint64]any    `json:"pending,omitempty"`
	Operator string            `json:"operator,omitempty"`
	Blocked  string            `json:"blocked,omitempty"`
}

type StatusStore struct {
	ID    string `json:"id"`
	State string `json:"state"`
}

type HealthShard struct {
	Shard       uint64   `json:"shard"`
	Expected    int      `json:"expected"`
	Live        int      `json:"running"`
	Running     []uint64 `json:"running_replicas,omitempty"`
	Leader      uint64   `json:"leader"`
	LeaderStore string   `json:"leader_store,omitempty"`
	Pending     []string `json:"pending,omitempty"`
	Operator    string   `json:"operator,omitempty"`
	Blocked     string   `json:"blocked,omitempty"`
	Zombies     []string `json:"zombies,omitempty"`
	Healthy     bool     `json:"healthy"`
}

type HealthRecord struct {
	Leader         string        `json:"leader"`
	Term           uint64        `json:"term"`
	Seq            uint64        `json:"seq"`
	Workers        int           `json:"workers"`
	WorkersRunning int           `json:"workers_running"`
	Shards         []HealthShard `json:"shards"`
	ShardsWanted   int           `json:"shards_wanted"`
}

type Status struct {
	LeaseHolder string         `json:"lease_holder"`
	LeaseError  string         `json:"lease_error,omitempty"`
	Seq         uint64         `json:"seq"`
	Term        uint64         `json:"term"`
	Leader      string         `json:"leader"`
	Workers     []StatusWorker `json:"workers"`
	Stores      []StatusStore  `json:"stores"`
	Shards      []StatusShard  `json:"shards"`
	Health      struct {
		Record   *HealthRecord `json:"record,omitempty"`
		Healthy  bool          `json:"healthy"`
		Problems []string      `json:"problems,omitempty"`
	} `json:"health"`
	// Stale is set when status answered from a copy (the leader's health
	// record) because the event stream's leader did not answer: not a
	// read of the stream, so no read for the checks.
	Stale *struct {
		Reason string `json:"reason"`
		Seq    uint64 `json:"seq"`
	} `json:"stale,omitempty"`
}

// StatusRead is one `status -o json`: exit 0 healthy, 1 degraded (both
// are reads), 2 unreadable.
type StatusRead struct {
	Code           int
	Status         Status
	Err            string // stderr of a failed read
	Invoke, Return time.Time
}

// OK reports whether the read returned a status of the stream (healthy or
// degraded), not a stale copy.
func (r StatusRead) OK() bool { return (r.Code == 0 || r.Code == 1) && r.Status.Stale == nil }

// ReadStatus runs `status -o json`.
func (c *Cluster) ReadStatus(ctx context.Context) StatusRead {
	r, err := c.Run(ctx, "status", "-o", "json", "--timeout", "3s")
	sr := StatusRead{Code: r.Code, Invoke: r.Invoke, Return: r.Return, Err: strings.TrimSpace(r.Stderr)}
	if err != nil {
		sr.Code, sr.Err = 2, err.Error()
		return sr
	}
	if sr.Code == 0 || sr.Code == 1 {
		if err := json.Unmarshal([]byte(r.Stdout), &sr.Status); err != nil {
			sr.Code, sr.Err = 2, fmt.Sprintf("status -o json: %v: %.200s", err, r.Stdout)
		} else if st := sr.Status.Stale; st != nil {
			sr.Err = "stale: " + st.Reason
		}
	}
	return sr
}

// Event is one line of a JSONL export.
type Event struct {
	Seq    uint64          `json:"seq"`
	Term   uint64          `json:"term"`
	Writer string          `json:"writer"`
	Type   string          `json:"type"`
	Data   json.RawMessage `json:"data"`
	Raw    string          `json:"raw,omitempty"`   // a record this build cannot decode
	Error  string          `json:"error,omitempty"` // why
}

// Export writes the stream to path with `replay export` and parses it.
func (c *Cluster) Export(ctx context.Context, path string) ([]Event, error) {
	r, err := c.Run(ctx, "replay", "export", "--out", path, "--timeout", "10s")
	if err != nil {
		return nil, err
	}
	if r.Code != 0 {
		return nil, fmt.Errorf("replay export: exit %d: %s", r.Code, strings.TrimSpace(r.Stderr))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseExport(f)
}

// ParseExport reads JSONL export lines.
func ParseExport(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 2<<20)
	line := 0
	for sc.Scan() {
		line++
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return out, fmt.Errorf("export line %d: %v", line, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// ReplayCheck runs `replay --file path --check`.
func (c *Cluster) ReplayCheck(ctx context.Context, path string) (CmdResult, error) {
	return c.Run(ctx, "replay", "--file", path, "--check")
}

// ReplicaKey names one running replica.
type ReplicaKey struct {
	Shard, Replica uint64
}

// StoreReplicas scrapes a store's /metrics for the replicas its NodeHost
// runs (termlog_store_replica_running{shard,replica}).
func (c *Cluster) StoreReplicas(ctx context.Context, name string) ([]ReplicaKey, error) {
	addr := c.Metrics[name]
	fams, err := c.scrape(ctx, name)
	if err != nil {
		return nil, err
	}
	var out []ReplicaKey
	f, ok := fams["termlog_store_replica_running"]
	if !ok {
		if _, ok := fams["termlog_store_replicas_running"]; !ok {
			return nil, fmt.Errorf("%s (%s): no store metrics", name, addr)
		}
		return nil, nil
	}
	for _, m := range f.GetMetric() {
		var k ReplicaKey
		for _, l := range m.GetLabel() {
			v, _ := strconv.ParseUint(l.GetValue(), 10, 64)
			switch l.GetName() {
			case "shard":
				k.Shard = v
			case "replica":
				k.Replica = v
			}
		}
		if m.GetGauge().GetValue() == 1 {
			out = append(out, k)
		}
	}
	return out, nil
}

// MetaLeading scrapes a meta replica's termlog_meta_is_leader and term.
func (c *Cluster) MetaLeading(ctx context.Context, name string) (leading bool, term uint64, err error) {
	fams, err := c.scrape(ctx, name)
	if err != nil {
		return false, 0, err
	}
	if f, ok := fams["termlog_meta_is_leader"]; ok && len(f.GetMetric()) > 0 {
		leading = f.GetMetric()[0].GetGauge().GetValue() == 1
	}
	if f, ok := fams["termlog_meta_term"]; ok && len(f.GetMetric()) > 0 {
		term = uint64(f.GetMetric()[0].GetGauge().GetValue())
	}
	return leading, term, nil
}

// scrapeClient keeps no idle connection: every scrape is its own, and
// nothing outlives it.
var scrapeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// scrape reads process name's /metrics: on 127.0.0.1, or in Netns mode
// dialled inside the process's own namespace (its loopback, which no cut
// reaches).
func (c *Cluster) scrape(ctx context.Context, name string) (map[string]*dto.MetricFamily, error) {
	hc := scrapeClient
	if nd := c.Node(name); nd != nil {
		hc = &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return nd.Dial(ctx, addr) }}}
	}
	return scrapeMetrics(ctx, hc, c.Metrics[name])
}

func scrapeMetrics(ctx context.Context, hc *http.Client, addr string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", addr, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}
