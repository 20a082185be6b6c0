package natsserver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/termlog/termlog/internal/wire"
)

// Role is who a connection is. Each role is one NKey user of the server
// with the subject permissions that role needs and nothing more.
type Role string

// The roles.
const (
	// RoleAdmin may do anything: create, import and repair streams, and
	// the operator RPCs (meta stepdown, store drain).
	RoleAdmin Role = "admin"
	// RoleMeta writes the event stream and the lease bucket, serves the
	// RPCs and calls the stores' exec subjects.
	RoleMeta Role = "meta"
	// RoleWorker sends the worker RPCs and receives its replies; nothing
	// else.
	RoleWorker Role = "worker"
	// RoleStore reads the event stream, sends the store RPCs and serves
	// the store exec subjects.
	RoleStore Role = "store"
	// RoleObserver reads the event stream and the lease bucket (status,
	// replay) and writes nothing.
	RoleObserver Role = "observer"
)

// Roles lists every role, admin first.
func Roles() []Role { return []Role{RoleAdmin, RoleMeta, RoleWorker, RoleStore, RoleObserver} }

// ParseRole checks a role name.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles() {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("unknown role %q (want one of %v)", s, Roles())
}

// SeedFile is the file in an auth dir holding role's NKey seed: the
// secret a client of that role connects with (mode 0600).
func SeedFile(dir string, r Role) string { return filepath.Join(dir, string(r)+".nk") }

// PublicKeyFile is the file in an auth dir holding role's NKey public key:
// all a server needs to know about the role.
func PublicKeyFile(dir string, r Role) string { return filepath.Join(dir, string(r)+".pub") }

// InitAuth makes dir hold one NKey per role (SeedFile and PublicKeyFile
// for each) unless it already holds a complete set, which it keeps. It
// reports whether it generated the set. Processes racing on the same dir
// end up with one set: the set is written to a temporary directory and
// renamed into place, and the loser of the rename uses the winner's set.
func InitAuth(dir string) (bool, error) {
	return writeDirOnce(dir, authComplete, "role keys ("+strings.Join(roleNames(), ", ")+")", func(tmp string) error {
		for _, r := range Roles() {
			kp, err := nkeys.CreateUser()
			if err != nil {
				return fmt.Errorf("create %s key: %w", r, err)
			}
			seed, err := kp.Seed()
			if err != nil {
				return err
			}
			pub, err := kp.PublicKey()
			if err != nil {
				return err
			}
			if err := os.WriteFile(SeedFile(tmp, r), append(seed, '\n'), 0o600); err != nil {
				return err
			}
			if err := os.WriteFile(PublicKeyFile(tmp, r), []byte(pub+"\n"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
}

// writeDirOnce makes dir hold what write writes unless complete(dir) says
// it holds it already. It reports whether it wrote. Processes racing on
// the same dir end up with the same files: write fills a temporary
// directory (mode 0700) that is renamed into place, and the loser of the
// rename uses the winner's files.
func writeDirOnce(dir string, complete func(string) error, what string, write func(tmp string) error) (bool, error) {
	if err := complete(dir); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("%s: %w", dir, err)
	}
	if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		if complete(dir) == nil {
			return false, nil // another process renamed its files in since the first look
		}
		return false, fmt.Errorf("%s exists but lacks %s: remove it or pick another", dir, what)
	}
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return false, fmt.Errorf("%w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+"-*")
	if err != nil {
		return false, fmt.Errorf("%w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := os.Chmod(tmp, 0o700); err != nil {
		return false, fmt.Errorf("%w", err)
	}
	if err := write(tmp); err != nil {
		return false, fmt.Errorf("%s: %w", dir, err)
	}
	// An empty dir is replaced by the rename; a non-empty one makes it fail.
	if err := os.Rename(tmp, dir); err != nil {
		if complete(dir) == nil {
			return false, nil // another process won
		}
		return false, fmt.Errorf("%s: %w", dir, err)
	}
	return true, nil
}

func roleNames() []string {
	var out []string
	for _, r := range Roles() {
		out = append(out, string(r)+".nk", string(r)+".pub")
	}
	return out
}

// authComplete is nil when dir holds every role's files.
func authComplete(dir string) error {
	for _, r := range Roles() {
		for _, f := range []string{SeedFile(dir, r), PublicKeyFile(dir, r)} {
			if _, err := os.Stat(f); err != nil {
				return err
			}
		}
	}
	return nil
}

// ServerAuth is what a server needs to authorise the roles of one termlog
// cluster: each role's public key. It never holds a secret.
type ServerAuth struct {
	// Cluster is the termlog cluster name the permissions are for.
	Cluster string
	// Keys maps each role to its NKey public key.
	Keys map[Role]string
}

// LoadServerAuth reads every role's PublicKeyFile from dir.
func LoadServerAuth(dir, cluster string) (*ServerAuth, error) {
	if err := wire.ValidCluster(cluster); err != nil {
		return nil, fmt.Errorf("server auth: %w", err)
	}
	a := &ServerAuth{Cluster: cluster, Keys: map[Role]string{}}
	for _, r := range Roles() {
		b, err := os.ReadFile(PublicKeyFile(dir, r))
		if err != nil {
			return nil, fmt.Errorf("server auth: %w (create the role keys with `termlog auth init --dir %s`)", err, dir)
		}
		pub := strings.TrimSpace(string(b))
		if !nkeys.IsValidPublicUserKey(pub) {
			return nil, fmt.Errorf("server auth: %s is not an NKey user public key", PublicKeyFile(dir, r))
		}
		a.Keys[r] = pub
	}
	return a, nil
}

// users are the server's NKey users: one per role with its permissions.
func (a *ServerAuth) users() ([]*server.NkeyUser, error) {
	if err := wire.ValidCluster(a.Cluster); err != nil {
		return nil, fmt.Errorf("server auth: %w", err)
	}
	var out []*server.NkeyUser
	for _, r := range Roles() {
		pub, ok := a.Keys[r]
		if !ok {
			return nil, fmt.Errorf("server auth: no key for role %s", r)
		}
		out = append(out, &server.NkeyUser{Nkey: pub, Permissions: Permissions(a.Cluster, r, pub)})
	}
	return out, nil
}

// InboxPrefix is the reply-subject prefix of a connection whose NKey
// public key is pub: each user may receive replies under its own prefix
// only, so no role can read another's replies (JetStream's included).
func InboxPrefix(pub string) string { return wire.Inbox(pub) }

// jsAPI is the JetStream API prefix.
const jsAPI = "$JS.API."

// streamReader are the API subjects that read a stream the way Log does:
// info, message get, and ephemeral pull consumers.
func streamReader(stream string) []string {
	return []string{
		jsAPI + "INFO",
		jsAPI + "STREAM.INFO." + stream,
		jsAPI + "STREAM.MSG.GET." + stream,
		jsAPI + "CONSUMER.CREATE." + stream + ".>",
		jsAPI + "CONSUMER.INFO." + stream + ".>",
		jsAPI + "CONSUMER.DELETE." + stream + ".>",
		jsAPI + "CONSUMER.MSG.NEXT." + stream + ".>",
	}
}

// kvReader are the API subjects of reading one KV bucket (the stream
// KV_<bucket>; Get is a direct get).
func kvReader(bucket string) []string {
	s := "KV_" + bucket
	return []string{
		jsAPI + "STREAM.INFO." + s,
		jsAPI + "STREAM.MSG.GET." + s,
		jsAPI + "DIRECT.GET." + s,
		jsAPI + "DIRECT.GET." + s + ".>",
	}
}

// snapshotReader are the API subjects of reading the snapshot object store
// of a cluster (the stream OBJ_<bucket>: info, list and chunk reads through
// consumers, direct gets of an object's metadata).
func snapshotReader(cluster string) []string {
	s := "OBJ_" + wire.SnapshotBucket(cluster)
	return append(streamReader(s),
		jsAPI+"DIRECT.GET."+s,
		jsAPI+"DIRECT.GET."+s+".>",
	)
}

// LeaseBucketName is the KV bucket of a cluster's leader lease.
func LeaseBucketName(cluster string) string { return wire.LeaseBucket(cluster) }

// Permissions are role's permissions in cluster for the user whose public
// key is pub; nil (everything) for RoleAdmin.
func Permissions(cluster string, r Role, pub string) *server.Permissions {
	inbox := InboxPrefix(pub) + ".>"
	rpc := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, wire.RPC(cluster, n))
		}
		return out
	}
	stream := wire.Stream(cluster)
	bucket := LeaseBucketName(cluster)
	health := wire.HealthBucket(cluster)
	// A responder may publish to the reply subject of a request it
	// received, once, for the server's default time.
	respond := &server.ResponsePermission{MaxMsgs: 1}
	switch r {
	case RoleAdmin:
		return nil
	case RoleMeta:
		allow := []string{
			wire.EventsWildcard(cluster), // fenced appends
			"$KV." + bucket + ".>",       // lease create, renew, release
			wire.ExecWildcard(cluster),   // config changes run by stores
			jsAPI + "STREAM.CREATE." + stream,
			jsAPI + "STREAM.CREATE.KV_" + bucket,
			jsAPI + "STREAM.LEADER.STEPDOWN.KV_" + bucket, // keep the lease's Raft leader with the stream's (meta/colocate.go)
			"$O." + wire.SnapshotBucket(cluster) + ".>",   // snapshot chunks and metadata
			jsAPI + "STREAM.CREATE.OBJ_" + wire.SnapshotBucket(cluster),
			jsAPI + "STREAM.PURGE.OBJ_" + wire.SnapshotBucket(cluster), // old snapshots' chunks
			"$KV." + health + ".>",                                     // the leader's health record
			jsAPI + "STREAM.CREATE.KV_" + health,
		}
		allow = append(allow, streamReader(stream)...)
		allow = append(allow, kvReader(bucket)...)
		allow = append(allow, kvReader(health)...)
		allow = append(allow, snapshotReader(cluster)...)
		return &server.Permissions{
			Publish: &server.SubjectPermission{Allow: allow},
			// The stream's leader elections: appends in flight are sent again at once.
			Subscribe: &server.SubjectPermission{Allow: []string{wire.RPCWildcard(cluster), inbox, wire.StreamLeaderElected(cluster)}},
			Response:  respond,
		}
	case RoleWorker:
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: rpc(wire.WorkerRPCs...)},
			Subscribe: &server.SubjectPermission{Allow: []string{inbox}},
		}
	case RoleStore:
		allow := append(rpc(wire.StoreRPCs...), streamReader(stream)...)
		allow = append(allow, snapshotReader(cluster)...)
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: allow},
			Subscribe: &server.SubjectPermission{Allow: []string{wire.ExecWildcard(cluster), inbox}},
			Response:  respond,
		}
	case RoleObserver:
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: slices.Concat(streamReader(stream), kvReader(bucket), kvReader(health), snapshotReader(cluster))},
			Subscribe: &server.SubjectPermission{Allow: []string{inbox}},
		}
	}
	// An unknown role may do nothing.
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Deny: []string{">"}},
		Subscribe: &server.SubjectPermission{Deny: []string{">"}},
	}
}

// ClientOptions are the options of a connection authenticated with the
// NKey seed in seedFile: the NKey signature and the user's inbox prefix.
func ClientOptions(seedFile string) ([]nats.Option, error) {
	b, err := os.ReadFile(seedFile)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", seedFile, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", seedFile, err)
	}
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		return nil, fmt.Errorf("credentials %s: %w", seedFile, err)
	}
	return []nats.Option{opt, nats.CustomInboxPrefix(InboxPrefix(pub))}, nil
}

// RoleOptions are ClientOptions for role's seed in the auth dir dir.
func RoleOptions(dir string, r Role) ([]nats.Option, error) {
	return ClientOptions(SeedFile(dir, r))
}
