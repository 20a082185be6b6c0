package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/user"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/termlog/termlog/meta/client"
)

func newShardCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{Use: "shard", Short: "Shard administration"})
	var (
		req    client.RecoverRequest
		asJSON bool
	)
	rc := &cobra.Command{
		Use:   "recover --shard N --from STORE [--dry-run | --yes] [--force]",
		Short: "Rebuild a shard that lost its quorum for good as a one-member shard from its replica on STORE (admin); the scheduler then adds replicas back",
		Long: `Rebuild a shard that lost its quorum for good (status says lost-quorum) from
one surviving replica. The leader asks every member store for its replica's applied
index and shows the plan: the replica recovered from, what is lost (entries another
replica applied after it), the replicas declared gone (retired: never started again)
and the one-member membership after. --dry-run only shows it; --yes records
shard.recovered, the named store rebuilds the shard from its own data and the
scheduler adds replicas back up to the replication factor. Refused, with the
reason, while a quorum is alive, when STORE holds no running replica of the shard,
or when another store applied more (unless --force).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Shard == 0 || req.From == "" {
				return usage(errors.New("--shard and --from are required"))
			}
			if !req.DryRun && !req.Yes {
				return usage(errors.New("a recovery declares replicas gone for good: run it with --dry-run first, then with --yes"))
			}
			if req.Operator == "" {
				req.Operator = operatorName()
			}
			rep, err := g.leaderRPC(cmd.Context(), client.RPCShardRecover, req)
			if rep.Recovery != nil {
				if asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					if jerr := enc.Encode(rep.Recovery); jerr != nil && err == nil {
						err = jerr
					}
				} else {
					printRecovery(cmd.OutOrStdout(), *rep.Recovery, req, err == nil)
				}
			}
			return err
		},
	}
	f := rc.Flags()
	f.Uint64Var(&req.Shard, "shard", 0, "the shard to recover")
	f.StringVar(&req.From, "from", "", "the store whose replica the shard is rebuilt from")
	f.BoolVar(&req.DryRun, "dry-run", false, "show the plan only")
	f.BoolVar(&req.Yes, "yes", false, "carry the plan out")
	f.BoolVar(&req.Force, "force", false, "recover from STORE even when another store's replica applied more (its entries after STORE's are lost)")
	f.StringVar(&req.Operator, "operator", "", "who runs the recovery, recorded in shard.recovered (default: user@host)")
	f.BoolVar(&asJSON, "json", false, "print the plan as JSON")
	cmd.AddCommand(rc)
	return cmd
}

func operatorName() string {
	name := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + h
	}
	return name
}

func printRecovery(w io.Writer, p client.RecoveryPlan, req client.RecoverRequest, ok bool) {
	fmt.Fprintf(w, "recovery of shard %d from replica %d on %s (applied index %d)\n", p.Shard, p.Replica, p.Store, p.Applied)
	fmt.Fprintf(w, "  members now: %s\n", replicaList(p.Members))
	for _, a := range p.Asked {
		if a.Error != "" {
			fmt.Fprintf(w, "  asked %-10s no answer: %s\n", a.Store, a.Error)
		} else {
			fmt.Fprintf(w, "  asked %-10s replica %d applied %d\n", a.Store, a.Replica, a.Applied)
		}
	}
	if p.Lost > 0 {
		fmt.Fprintf(w, "  LOST: %d entries another replica applied after index %d\n", p.Lost, p.Applied)
	} else if ok {
		fmt.Fprintln(w, "  lost: nothing any answering replica applied")
	}
	if len(p.Gone) > 0 {
		fmt.Fprintf(w, "  declared gone (retired, never started again): %s\n", replicaList(p.Gone))
	}
	if len(p.After) > 0 {
		fmt.Fprintf(w, "  membership after: %s, then the scheduler adds replicas back\n", replicaList(p.After))
	}
	switch {
	case !ok:
	case p.Seq != 0:
		fmt.Fprintf(w, "recorded shard.recovered at seq %d; %s rebuilds the shard (termlog replay --history shard:%d)\n", p.Seq, p.Store, p.Shard)
	case req.DryRun:
		fmt.Fprintf(w, "dry run: nothing done; run it with --yes instead of --dry-run\n")
	}
}

func replicaList(m map[uint64]string) string {
	parts := make([]string, 0, len(m))
	for _, r := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d@%s", r, m[r]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}
