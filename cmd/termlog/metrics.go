package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// The collectors read the components' own state at scrape time: no
// goroutine, no copy of any state, nothing to keep in step.

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc("termlog_"+name, help, labels, nil)
}

var (
	dMetaTerm       = desc("meta_term", "The term of this replica's projection (the leader's term while it leads).", "replica")
	dMetaLeader     = desc("meta_is_leader", "1 while this replica leads.", "replica")
	dMetaSeq        = desc("meta_projected_seq", "The last stream seq this replica projected.", "replica")
	dMetaLag        = desc("meta_projection_lag_events", "Events in the stream this replica has not projected yet, by the stream's tail as the replica read it in the last 5 s (absent when it could not).", "replica")
	dMetaFenced     = desc("meta_fenced_appends_total", "Appends of this replica refused by the stream's CAS.", "replica")
	dMetaRejected   = desc("meta_rejected_events_total", "Events the projection rejected or could not decode, by kind.", "replica", "kind")
	dMetaWorkers    = desc("meta_workers", "Active workers in the projection, by state.", "replica", "state")
	dMetaStores     = desc("meta_stores", "Stores in the projection, by state (up, down, draining, tombstone).", "replica", "state")
	dMetaHeartbeats = desc("meta_heartbeats_total", "Worker heartbeats answered as leader.", "replica")
	dMetaRecovery   = desc("meta_barrier_recovery_seconds", "Duration of the last completed barrier recovery of this replica's terms.", "replica")
	dShardExpected  = desc("shard_replicas_expected", "Replicas a shard should have (leader only).", "shard")
	dShardRunning   = desc("shard_replicas_running", "A shard's members running on live stores (leader only).", "shard")
	dShardLeader    = desc("shard_leader_known", "1 when the shard's Raft leader is known (leader only).", "shard")
	dShardPending   = desc("shard_pending_changes", "A shard's recorded intents without an outcome (leader only).", "shard")
	dShardOperator  = desc("shard_operator_running", "1 while an operator runs on the shard (leader only).", "shard")
	dShardBlocked   = desc("shard_blocked", "1 while the scheduler records the shard as blocked (leader only).", "shard")
	dShardHealthy   = desc("shard_healthy", "1 when the shard is healthy (leader only).", "shard")
	dShardNoQuorum  = desc("shard_lost_quorum", "1 when fewer of the shard's members than a quorum have run for longer than the threshold: recover it with `termlog shard recover` (leader only).", "shard")
	dStoreChanges   = desc("store_config_changes_total", "Config changes this store executed, by outcome.", "store", "outcome")
	dStoreRunning   = desc("store_replicas_running", "Replicas running in this store's NodeHost.", "store")
	dStoreRefused   = desc("store_replicas_refused", "Persisted replicas the reconciler refused to start (zombies).", "store")
	dStoreReplica   = desc("store_replica_running", "1 for each replica running in this store's NodeHost (the chaos suite checks each against the projection).", "store", "shard", "replica")
	dWorkerResets   = desc("worker_control_session_resets_total", "Control sessions reset by a newer one.", "endpoint")
	dWorkerSessions = desc("worker_control_sessions_total", "Control sessions accepted.", "endpoint")
	dWorkerActive   = desc("worker_registered", "1 while the worker holds a registration.", "endpoint")
)

type metaCollector struct {
	r *meta.Replica
}

// lagFresh is how old a stream tail may be for the lag gauge.
const lagFresh = 5 * time.Second

func (c metaCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c metaCollector) Collect(ch chan<- prometheus.Metric) {
	id := c.r.ID()
	v := c.r.View()
	leading, term := c.r.Leading()
	if !leading {
		term = v.Term
	}
	gauge := func(d *prometheus.Desc, x float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x, l...)
	}
	counter := func(d *prometheus.Desc, x float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, x, l...)
	}
	gauge(dMetaTerm, float64(term), id)
	gauge(dMetaLeader, b2f(leading), id)
	gauge(dMetaSeq, float64(v.Seq), id)
	// The tail as the replica last read it: a scrape asks NATS nothing, so
	// it answers at once when NATS does not (the chaos suite reads
	// is_leader this way while a leader is cut off). A tail older than
	// lagFresh is left out.
	if tail, age, ok := c.r.StreamTail(); ok && age < lagFresh {
		gauge(dMetaLag, float64(tail-min(tail, v.Seq)), id)
	}
	counter(dMetaFenced, float64(c.r.Fenced()), id)
	k := v.Counters
	counter(dMetaRejected, float64(k.StaleTerm), id, projections.AnomalyStaleTerm)
	counter(dMetaRejected, float64(k.Rejected-k.StaleTerm), id, "other")
	counter(dMetaRejected, float64(k.Corrupt), id, projections.AnomalyCorrupt)
	states := map[string]int{projections.WorkerStarting: 0, projections.WorkerRunning: 0}
	for _, w := range v.Workers {
		states[w.State]++
	}
	for st, n := range states {
		gauge(dMetaWorkers, float64(n), id, st)
	}
	stores := map[string]int{events.StoreUp: 0, events.StoreDown: 0, events.StoreDraining: 0}
	for _, st := range v.Stores {
		stores[st.State]++
	}
	for st, n := range stores {
		gauge(dMetaStores, float64(n), id, st)
	}
	counter(dMetaHeartbeats, float64(c.r.Heartbeats()), id)
	terms := c.r.Terms()
	for i := len(terms) - 1; i >= 0; i-- {
		if terms[i].Recovery.State == meta.RecoveryComplete {
			gauge(dMetaRecovery, terms[i].Recovery.Took.Seconds(), id)
			break
		}
	}
	if !leading {
		return
	}
	for _, h := range c.r.Health() {
		s := strconv.FormatUint(h.Shard, 10)
		gauge(dShardExpected, float64(h.Expected), s)
		gauge(dShardRunning, float64(h.Live), s)
		gauge(dShardLeader, b2f(h.Leader != 0), s)
		gauge(dShardPending, float64(len(h.Pending)), s)
		gauge(dShardOperator, b2f(h.Operator != ""), s)
		gauge(dShardBlocked, b2f(h.Blocked != ""), s)
		gauge(dShardHealthy, b2f(h.Healthy), s)
		gauge(dShardNoQuorum, b2f(h.LostQuorum), s)
	}
}

type storeCollector struct{ s *logstore.Store }

func (c storeCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c storeCollector) Collect(ch chan<- prometheus.Metric) {
	id := c.s.Host().StoreID()
	for outcome, n := range c.s.ConfigChanges() {
		ch <- prometheus.MustNewConstMetric(dStoreChanges, prometheus.CounterValue, float64(n), id, outcome)
	}
	infos := c.s.Host().ShardInfos()
	ch <- prometheus.MustNewConstMetric(dStoreRunning, prometheus.GaugeValue, float64(len(infos)), id)
	for _, si := range infos {
		ch <- prometheus.MustNewConstMetric(dStoreReplica, prometheus.GaugeValue, 1, id, strconv.FormatUint(si.Shard, 10), strconv.FormatUint(si.Replica, 10))
	}
	ch <- prometheus.MustNewConstMetric(dStoreRefused, prometheus.GaugeValue, float64(len(c.s.Reconciler().Skipped())), id)
}

type workerCollector struct {
	agent *client.Agent
	w     *client.Worker
}

func (c workerCollector) Describe(ch chan<- *prometheus.Desc) { prometheus.DescribeByCollect(c, ch) }

func (c workerCollector) Collect(ch chan<- prometheus.Metric) {
	ep := c.agent.Addr()
	st := c.agent.Stats()
	ch <- prometheus.MustNewConstMetric(dWorkerResets, prometheus.CounterValue, float64(st.Resets), ep)
	ch <- prometheus.MustNewConstMetric(dWorkerSessions, prometheus.CounterValue, float64(st.Accepted), ep)
	ch <- prometheus.MustNewConstMetric(dWorkerActive, prometheus.GaugeValue, b2f(c.w.Ref().ID != 0), ep)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// serveMetrics serves reg's metrics at http://addr/metrics until ctx ends;
// it returns once the server has stopped. The listener is opened before it
// returns an error, so a taken address fails at start.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, lg zerolog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			lg.Warn().Err(err).Msg("metrics server")
		}
	}()
	lg.Info().Str("addr", "http://"+ln.Addr().String()+"/metrics").Msg("serving metrics")
	stop := func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
		<-done
	}
	return stop, nil
}

// validMetricsAddr checks --metrics-addr before anything starts.
func validMetricsAddr(addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usage(fmt.Errorf("--metrics-addr %q: want host:port, e.g. 127.0.0.1:9464: %v", addr, err))
	}
	return nil
}

// metricsFlag adds --metrics-addr.
func metricsFlag(f *pflag.FlagSet, addr *string) {
	f.StringVar(addr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9464 (default off)")
}

// metricsFor serves collectors at addr until the returned stop is called
// ("" serves nothing).
func metricsFor(ctx context.Context, addr string, lg zerolog.Logger, cs ...prometheus.Collector) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	reg, err := registry(cs...)
	if err != nil {
		return nil, err
	}
	return serveMetrics(ctx, addr, reg, lg)
}

// registry is a role's metrics: its components', termlog_build_info, and
// the Go runtime's and the process's (go_*, process_*).
func registry(cs ...prometheus.Collector) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	v := buildVersion()
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "termlog_build_info", Help: "1, labelled with the binary's module version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": v.Version, "revision": v.Revision, "goversion": v.Go},
	})
	info.Set(1)
	for _, c := range []prometheus.Collector{combined(cs), info, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return reg, nil
}

// combined collects several components of one process (up has three
// metas and three stores, whose metrics differ only by a label). It is an
// unchecked collector: it describes nothing up front.
type combined []prometheus.Collector

func (combined) Describe(chan<- *prometheus.Desc) {}

func (c combined) Collect(ch chan<- prometheus.Metric) {
	for _, x := range c {
		x.Collect(ch)
	}
}
