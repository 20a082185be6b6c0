// Package wire names everything termlog puts on NATS, once: the event
// stream and its subjects, the RPC subjects and which role sends each, the
// store exec subjects, and the KV and object buckets. The roles'
// permissions (natsserver) are built from these names, and the
// clients (meta, meta/client, logstore) send on them, so a new RPC or
// bucket cannot be used without being granted. Standard library only.
package wire

import (
	"errors"
	"fmt"
	"strings"
)

// ValidCluster checks a cluster name: it is part of subjects and bucket
// names, so only letters, digits, '-' and '_' are allowed.
func ValidCluster(c string) error {
	if c == "" {
		return errors.New("empty cluster name")
	}
	for _, r := range c {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("cluster name %q: only letters, digits, '-' and '_' are allowed", c)
		}
	}
	return nil
}

// Stream is the event stream of cluster.
func Stream(cluster string) string { return "TERMLOG_" + strings.ToUpper(cluster) }

// StreamLeaderElected is the subject of JetStream's advisory that cluster's
// event stream has elected a Raft leader (the meta leader resends its
// unanswered appends at it).
func StreamLeaderElected(cluster string) string {
	return "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED." + Stream(cluster)
}

// EventSubject is the subject of an event of kind typ ("<cluster>.ev.<type>").
func EventSubject(cluster, typ string) string { return cluster + ".ev." + typ }

// EventsWildcard matches every event subject of cluster.
func EventsWildcard(cluster string) string { return cluster + ".ev.>" }

// RPC names, served by the meta leader on RPC(cluster, name).
const (
	RPCRegister       = "register"
	RPCActivate       = "activate"
	RPCHeartbeat      = "heartbeat"
	RPCDeregister     = "deregister"
	RPCStepDown       = "stepdown"
	RPCStoreRegister  = "store.register"
	RPCStoreHeartbeat = "store.heartbeat"
	RPCStoreDrain     = "store.drain"
	RPCStoreSelfDrain = "store.selfdrain"
	RPCShardRecover   = "shard.recover"
)

// WorkerRPCs are the RPCs a worker sends (the worker role's grants).
var WorkerRPCs = []string{RPCRegister, RPCActivate, RPCHeartbeat, RPCDeregister}

// StoreRPCs are the RPCs a log store sends (the store role's grants).
var StoreRPCs = []string{RPCStoreRegister, RPCStoreHeartbeat, RPCStoreSelfDrain}

// AdminRPCs are the RPCs only an admin sends.
var AdminRPCs = []string{RPCStepDown, RPCStoreDrain, RPCShardRecover}

// RPC is the subject of RPC name in cluster.
func RPC(cluster, name string) string { return cluster + ".rpc." + name }

// RPCWildcard matches every RPC subject of cluster (the leader serves it).
func RPCWildcard(cluster string) string { return cluster + ".rpc.>" }

// Exec is where store serves the scheduler's config changes.
func Exec(cluster, store string) string { return cluster + ".store." + store + ".exec" }

// ExecWildcard matches every store's exec subject.
func ExecWildcard(cluster string) string { return cluster + ".store.*.exec" }

func bucketPrefix(cluster string) string { return strings.ReplaceAll(cluster, ".", "_") }

// LeaseBucket is the KV bucket of the leader lease; LeaseKey its key.
func LeaseBucket(cluster string) string { return bucketPrefix(cluster) + "_leader" }

// LeaseKey is the lease's key in LeaseBucket.
const LeaseKey = "leader"

// HealthBucket is the KV bucket of the leader's health record; HealthKey its key.
func HealthBucket(cluster string) string { return bucketPrefix(cluster) + "_health" }

// HealthKey is the health record's key in HealthBucket.
const HealthKey = "cluster"

// SnapshotBucket is the object store of projection snapshots.
func SnapshotBucket(cluster string) string { return cluster + "_snapshots" }

// Inbox is the inbox prefix of the user with public key pub: each user
// may receive only there.
func Inbox(pub string) string { return "_INBOX." + pub }
