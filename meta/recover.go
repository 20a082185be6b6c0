package meta

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// recoverAsk bounds the question to each member store of a shard being
// recovered (its applied index).
const recoverAsk = 3 * time.Second

// errRecoverRefused marks a plan sched.PlanRecovery refused.
var errRecoverRefused = errors.New("recovery refused")

// shardDuty is an operator's shard recovery (shard.recover).
type shardDuty struct {
	proj   *view.Projector
	commit *committer
	exec   func(ctx context.Context, store string, req client.ExecRequest) (client.ExecReply, error) // storeDuty.exec
	health func() sched.Health
	logger zerolog.Logger
}

// shardRecover handles shard.recover: it asks every member store of the
// shard for its replica's applied index, plans the recovery
// (sched.PlanRecovery) on the projection and, with Yes and not DryRun,
// appends shard.recovered with the leader's fence in the same decision.
func (sr *shardDuty) shardRecover(ctx context.Context, req client.RecoverRequest) client.Reply {
	v := sr.proj.View()
	sh := v.Shards[req.Shard]
	if sh == nil {
		return client.Reply{Error: &client.RPCError{Code: client.CodeBadRequest, Message: fmt.Sprintf("shard %d does not exist", req.Shard)}}
	}
	stores := map[string]bool{}
	for _, st := range sh.Members {
		stores[st] = true
	}
	for _, p := range sh.Pending {
		stores[p.Store] = true
	}
	asked := sr.askApplied(ctx, req.Shard, slices.Sorted(maps.Keys(stores)))
	var health *sched.ShardHealth
	for _, h := range sr.health().Shards {
		if h.Shard == req.Shard {
			health = &h
		}
	}
	var plan client.RecoveryPlan
	var planErr error
	seq, err := sr.commit.Submit(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		var ev events.ShardRecovered
		plan, ev, planErr = sched.PlanRecovery(v, health, req, asked)
		if planErr != nil || req.DryRun || !req.Yes {
			return nil, nil
		}
		return []events.Payload{ev}, nil
	})
	if planErr != nil {
		return client.Reply{Recovery: &plan, Error: &client.RPCError{Code: client.CodeBadRequest, Message: fmt.Sprintf("%v: %v", errRecoverRefused, planErr)}}
	}
	if err != nil {
		return unavailable(err)
	}
	if req.Yes && !req.DryRun {
		plan.Seq = seq
		sr.logger.Warn().Uint64("shard", req.Shard).Uint64("replica", plan.Replica).Str("store", plan.Store).Uint64("applied", plan.Applied).
			Str("operator", req.Operator).Uint64("seq", seq).Msg("shard recovered by an operator: rebuilt as a one-member shard, the gone replicas retired")
	}
	return client.Reply{Recovery: &plan}
}

// askApplied asks each store for its replica of shard and its applied index.
func (sr *shardDuty) askApplied(ctx context.Context, shard uint64, stores []string) []client.ReplicaApplied {
	out := make([]client.ReplicaApplied, len(stores))
	var wg sync.WaitGroup
	for i, st := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			actx, cancel := context.WithTimeout(ctx, recoverAsk)
			defer cancel()
			out[i] = client.ReplicaApplied{Store: st}
			rep, err := sr.exec(actx, st, client.ExecRequest{Op: client.ExecApplied, Shard: shard})
			switch {
			case err != nil:
				out[i].Error = err.Error()
			case rep.Outcome != client.OutcomeApplied:
				out[i].Error = fmt.Sprintf("%s: %s", rep.Outcome, rep.Error)
			default:
				out[i].Replica, out[i].Applied = rep.Replica, rep.Applied
			}
		}()
	}
	wg.Wait()
	return out
}
