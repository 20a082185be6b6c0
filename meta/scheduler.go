package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/decide"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// SchedulerConfig configures the shard scheduler. Zero values take defaults;
// Shards 0 disables bootstrapping new shards.
type SchedulerConfig struct {
	Shards       int           // shards to keep
	Replicas     int           // replicas per shard, default 3
	StoreTimeout time.Duration // a store without heartbeats this long is down, default 10s
	StepTimeout  time.Duration // bound of one operator step, default 10s
	Interval     time.Duration // planning tick, default 250ms
	Backoff      time.Duration // wait after a failed operator before re-planning the shard, doubled per failure, default 1s
	BackoffMax   time.Duration // cap of that wait, default 2m
	// LostQuorumAfter is how long a shard may run fewer members than a
	// quorum before its health says lost-quorum, default 3*StoreTimeout.
	LostQuorumAfter time.Duration
}

// decisions is the configuration of the pure decisions.
func (c *SchedulerConfig) decisions() sched.Config {
	return sched.Config{Shards: c.Shards, Replicas: c.Replicas, StoreTimeout: c.StoreTimeout, StepTimeout: c.StepTimeout,
		Backoff: c.Backoff, BackoffMax: c.BackoffMax, Retry: c.Interval, LostQuorumAfter: c.LostQuorumAfter}.Defaults()
}

// defaults fills the zero fields: the loop's Interval here, the rest as
// the decisions default them.
func (c *SchedulerConfig) defaults() {
	if c.Interval <= 0 {
		c.Interval = 250 * time.Millisecond
	}
	d := c.decisions()
	c.Replicas, c.StoreTimeout, c.StepTimeout, c.Backoff, c.BackoffMax, c.LostQuorumAfter = d.Replicas, d.StoreTimeout, d.StepTimeout, d.Backoff, d.BackoffMax, d.LostQuorumAfter
}

// ShardHealth is one shard's health as the leader's last decision saw it.
type ShardHealth = sched.ShardHealth

// schedState is what the leader's RPC handlers share with its scheduler
// loop: the stores' latest reports (written by the handlers) and the last
// decision's health (written by the loop). It belongs to the term's loop:
// the handlers report by messages, the scheduler's decision (which runs on
// the loop) reads the reports in place, and the health is read by messages.
// The scheduler loop owns everything else (its sched.Memory, the execs it
// runs).
type schedState struct {
	reports map[string]sched.Report
	health  sched.Health
}

func newSchedState() *schedState {
	return &schedState{reports: map[string]sched.Report{}}
}

// storeDuty is the term's stores and shards: the store RPCs, the
// scheduler's loop (the shell of sched.Decide) and the execs it sends.
type storeDuty struct {
	cfg        *Config
	proj       *view.Projector
	commit     *committer
	loop       *termLoop // owns sched
	sched      *schedState
	term       uint64
	leaseFresh func() error // the lease keeper's check
	logger     zerolog.Logger
}

// report records a store's report, on the term's loop.
func (sd *storeDuty) report(store string, r sched.Report) {
	sd.loop.do(context.Background(), func() { sd.sched.reports[store] = r })
}

// health is the last scheduling decision's health, read on the term's loop.
func (l *leaderSession) health() sched.Health {
	var h sched.Health
	l.loop.read(func() { h = l.sched.health })
	return h
}

// storeRegister handles store.register: one decision (decide.StoreRegister),
// answered once its events are stored, the store's report recorded then.
func (sd *storeDuty) storeRegister(ctx context.Context, req client.StoreRegisterRequest) client.Reply {
	var d decide.Decision
	_, err := sd.commit.Submit(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		d = decide.StoreRegister(v, req)
		return d.Events, nil
	})
	if err != nil {
		return unavailable(err)
	}
	if d.Renew {
		sd.report(req.Store, sched.Report{Incarnation: req.Incarnation, Started: req.Started, At: sd.cfg.Clock.Now()})
	}
	return d.Reply
}

// storeHeartbeat handles store.heartbeat: memory only
// (decide.StoreHeartbeat).
func (sd *storeDuty) storeHeartbeat(_ context.Context, hb client.StoreHeartbeat) client.Reply {
	var rep client.Reply
	var known bool
	sd.proj.Peek(func(v *projections.State) { rep, known = decide.StoreHeartbeat(v, hb) })
	if known {
		sd.report(hb.Store, sched.Report{Incarnation: hb.Incarnation, Started: hb.Started, At: sd.cfg.Clock.Now(), Shards: hb.Shards, Skipped: hb.Skipped})
	}
	return rep
}

// storeDrain handles store.drain (decide.StoreDrain).
func (sd *storeDuty) storeDrain(ctx context.Context, req client.DrainRequest) client.Reply {
	var d decide.Decision
	_, err := sd.commit.Submit(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		d = decide.StoreDrain(v, req, sd.cfg.Clock.Now())
		return d.Events, nil
	})
	if err != nil {
		return unavailable(err)
	}
	return d.Reply
}

// storeSelfDrain handles store.selfdrain (decide.StoreSelfDrain).
func (sd *storeDuty) storeSelfDrain(ctx context.Context, req client.SelfDrainRequest) client.Reply {
	var d decide.Decision
	_, err := sd.commit.Submit(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		d = decide.StoreSelfDrain(v, req, sd.cfg.Clock.Now())
		return d.Events, nil
	})
	if err != nil {
		return unavailable(err)
	}
	if d.Reply.Error == nil {
		sd.logger.Info().Str("store", req.Store).Dur("for", time.Duration(req.ForMS)*time.Millisecond).Msg("store drains itself for a planned restart")
	}
	return d.Reply
}

// scheduleLoop is the shell of the pure shard decisions (package sched):
// every tick, and whenever an exec's result comes back, it gathers the
// projected view, the stores' reports and now, calls sched.Decide, appends
// the events it returns with the fence, and runs the execs it returns once
// their intents are stored. The loop owns the scheduler's memory; exec
// goroutines are owned by it and joined before it returns.
func (sd *storeDuty) scheduleLoop(ctx context.Context) {
	interval := sd.cfg.Scheduler.Interval
	results := make(chan sched.Result)
	var wg sync.WaitGroup
	defer wg.Wait()
	var mem sched.Memory
	for {
		mem = sd.schedulePasses(ctx, &wg, mem, results)
		select {
		case <-ctx.Done():
			return
		case r := <-results:
			mem = mem.WithResult(r)
		case <-sd.cfg.Clock.After(interval):
		}
	}
}

// maxPasses bounds the decisions made back to back: one pass plans one step
// per shard, and the next pass sees the events of the one before.
const maxPasses = 8

// schedulePasses decides, appends and launches execs until a decision
// appends nothing (or maxPasses). It returns the memory to keep.
func (sd *storeDuty) schedulePasses(ctx context.Context, wg *sync.WaitGroup, mem sched.Memory, results chan<- sched.Result) sched.Memory {
	cfg := sd.cfg.Scheduler.decisions()
	for range maxPasses {
		var out sched.Output
		now := sd.cfg.Clock.Now()
		_, err := sd.commit.Submit(ctx, "", func(v *projections.State) ([]events.Payload, error) {
			// On the term's loop, which owns the reports: read in place.
			out = sched.Decide(sched.Input{View: v, Reports: sd.sched.reports, Memory: mem, Now: now, Term: sd.term, Config: cfg})
			return out.Events, nil
		})
		if err != nil {
			if ctx.Err() == nil {
				sd.logger.Warn().Err(err).Msg("schedule: append failed; deciding again")
			}
			return mem
		}
		mem = out.Memory
		var prev sched.Health
		sd.loop.do(ctx, func() { prev, sd.sched.health = sd.sched.health, out.Health })
		sd.logLostQuorum(prev, out.Health)
		for _, ev := range out.Events {
			sd.logDecision(ev)
		}
		for _, x := range out.Execs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := sd.runExec(ctx, x)
				select {
				case results <- r:
				case <-ctx.Done():
				}
			}()
		}
		if len(out.Events) == 0 {
			return mem
		}
	}
	return mem
}

// logLostQuorum logs a shard that lost quorum once, when it does (and again
// for each new leader), with the runbook's command, and its end.
func (sd *storeDuty) logLostQuorum(prev, cur sched.Health) {
	was := map[uint64]bool{}
	for _, h := range prev.Shards {
		was[h.Shard] = h.LostQuorum
	}
	for _, h := range cur.Shards {
		switch {
		case h.LostQuorum && !was[h.Shard]:
			sd.logger.Error().Uint64("shard", h.Shard).Int("running", h.Live).Int("members", len(h.Members)).Strs("gone", h.Gone).
				Time("since", h.QuorumShortSince).Str("runbook", h.Runbook).
				Msg("shard lost quorum: Raft can neither commit nor read; only an operator's recovery rebuilds it")
		case !h.LostQuorum && was[h.Shard]:
			sd.logger.Info().Uint64("shard", h.Shard).Int("running", h.Live).Msg("shard has a quorum again")
		}
	}
}

func (sd *storeDuty) logDecision(ev events.Payload) {
	switch d := ev.(type) {
	case events.OperatorStarted:
		sd.logger.Info().Str("op", d.Op).Uint64("shard", d.Shard).Strs("steps", d.Steps).Msg("operator started")
	case events.OperatorFinished:
		sd.logger.Info().Str("op", d.Op).Uint64("shard", d.Shard).Msg("operator finished")
	case events.OperatorFailed:
		sd.logger.Warn().Str("op", d.Op).Uint64("shard", d.Shard).Str("reason", d.Reason).Msg("operator failed")
	case events.ShardBlocked:
		if d.Reason == "" {
			sd.logger.Info().Uint64("shard", d.Shard).Msg("shard no longer blocked")
		} else {
			sd.logger.Warn().Uint64("shard", d.Shard).Str("reason", d.Reason).Msg("shard blocked: no config change proposed")
		}
	case events.StoreState:
		sd.logger.Info().Str("store", d.Store).Str("state", d.State).Msg("store state")
	case events.ShardObserved:
		sd.logger.Info().Uint64("shard", d.Shard).Uint64("ccid", d.CCID).Uint64("leader", d.Leader).Msg("shard observed")
	}
}

// runExec sends one exec and returns its result; no reply is an unknown
// outcome.
func (sd *storeDuty) runExec(ctx context.Context, x sched.Exec) sched.Result {
	if fp := map[string]string{client.ExecAdd: FPOperatorBeforeAdd, client.ExecRemove: FPOperatorBeforeRemove}[x.Req.Op]; fp != "" {
		if err := sd.cfg.Failpoints.Hit(ctx, fp); err != nil {
			return sched.Result{Exec: x, Reply: client.ExecReply{Outcome: client.OutcomeError, Error: err.Error()}, At: sd.cfg.Clock.Now()}
		}
	}
	// The same check as before every append: a leader resumed after a
	// pause past its lease sends no config change (the store's fence
	// refuses it only once it has folded the new term.started). Not sent,
	// so an error, not an unknown outcome.
	if err := sd.leaseFresh(); err != nil {
		return sched.Result{Exec: x, Reply: client.ExecReply{Outcome: client.OutcomeError, Error: err.Error()}, At: sd.cfg.Clock.Now()}
	}
	timeout := max(x.Deadline.Sub(sd.cfg.Clock.Now()), time.Second)
	ectx, cancel := context.WithTimeout(ctx, timeout)
	rep, err := sd.exec(ectx, x.Store, x.Req)
	cancel()
	if err != nil {
		rep = client.ExecReply{Outcome: client.OutcomeError, Error: err.Error()}
	}
	sd.logger.Info().Str("exec", x.String()).Str("outcome", rep.Outcome).Uint64("ccid", rep.CCID).Str("error", rep.Error).Msg("config change exec")
	if x.Req.Op != client.ExecMembership {
		if err := sd.cfg.Failpoints.Hit(ctx, FPOperatorAfterExec); err != nil {
			rep = client.ExecReply{Outcome: client.OutcomeUnknown, Error: err.Error()}
		}
	}
	return sched.Result{Exec: x, Reply: rep, At: sd.cfg.Clock.Now()}
}

// exec sends one request to a store's executor, bounded by ctx.
func (sd *storeDuty) exec(ctx context.Context, store string, req client.ExecRequest) (client.ExecReply, error) {
	if sd.cfg.NC == nil {
		return client.ExecReply{}, errors.New("no NATS connection for store RPCs")
	}
	if dl, ok := ctx.Deadline(); ok {
		req.TimeoutMS = max(time.Until(dl).Milliseconds()-100, 100)
	}
	b, _ := json.Marshal(req)
	msg, err := sd.cfg.NC.RequestWithContext(ctx, client.ExecSubject(sd.cfg.Cluster, store), b)
	if err != nil {
		return client.ExecReply{Outcome: client.OutcomeUnknown, Error: err.Error()}, nil
	}
	var rep client.ExecReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return client.ExecReply{}, fmt.Errorf("store %s: malformed exec reply: %v", store, err)
	}
	return rep, nil
}

// Health reports every shard's health as the leader's last scheduling
// decision saw it (nil when following).
func (r *Replica) Health() []ShardHealth {
	return r.HealthReport().Shards
}

// HealthReport is the leader's last scheduling decision's health, shards
// and stores, with its provenance (zero when following).
func (r *Replica) HealthReport() sched.Health {
	r.mu.Lock()
	l := r.leader
	r.mu.Unlock()
	if l == nil {
		return sched.Health{}
	}
	return l.health()
}
