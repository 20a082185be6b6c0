// Package logstore is a log replica process: a dragonboat NodeHost, the
// replicated log state machine of each shard, the membership gate that never
// starts a replica the projection does not list as a member, the reconcile
// loop that makes the NodeHost match the projected membership, and the
// config-change executor that meta's scheduler drives through a live member.
//
// The pure part is Plan (reconcile.go); everything else is a thin shell
// around one NodeHost. StartReplica is called in exactly one place
// (replicas.go, startMember).
package logstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lni/dragonboat/v4"
	dbconfig "github.com/lni/dragonboat/v4/config"
	dblogger "github.com/lni/dragonboat/v4/logger"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/internal/clock"
)

// LogDB profiles. The profile is a hard setting of the data directory: it is
// recorded on first start and cannot change afterwards.
const (
	// LogDBTiny is one LogDB shard and one engine worker per stage with small
	// write buffers: well under a MiB of buffers and a few dozen goroutines.
	LogDBTiny = "tiny"
	// LogDBDefault is dragonboat's default: 16 LogDB shards and up to 8 GiB of
	// write buffers, ~265 goroutines.
	LogDBDefault = "default"
)

// Config configures a Host. The zero value of every numeric field means its
// default.
type Config struct {
	// StoreID is the store's identity in the event stream. It is written to
	// DataDir on first start; a different id on a later start is an error.
	StoreID string
	// DataDir holds the store id file, the NodeHost dir and the WAL dir.
	DataDir string
	// RaftAddr is this NodeHost's Raft address and identity: an explicit
	// host:port with a non-zero port (never ":0" nor an unspecified host).
	RaftAddr string
	// RTTMillisecond is the Raft tick (default 50).
	RTTMillisecond uint64
	// ElectionRTT and HeartbeatRTT are in ticks (defaults 10 and 1).
	ElectionRTT  uint64
	HeartbeatRTT uint64
	// SnapshotEntries is how many applied entries trigger a snapshot (0:
	// dragonboat's default of no automatic snapshots); CompactionOverhead is
	// how many entries are kept behind a snapshot (default 100 when
	// SnapshotEntries is set).
	SnapshotEntries    uint64
	CompactionOverhead uint64
	// LogDB is LogDBTiny or LogDBDefault. Empty means the profile recorded in
	// DataDir, or LogDBTiny for a new DataDir.
	LogDB string
	// Logger receives the store's own log lines (dragonboat keeps its own
	// process-global loggers; see SetDragonboatLogLevel).
	Logger zerolog.Logger
	// Clock paces the store's own retries (nil: the wall clock). Raft's
	// ticks are dragonboat's and always use the wall clock.
	Clock clock.Clock
	// TLS, when set, makes the Raft traffic of the NodeHost mutual TLS
	// (dragonboat's MutualTLS): it presents CertFile to its peers, as a
	// server and as a client, and accepts only peers whose certificate
	// CAFile signed. The certificate must be valid for the host of every
	// RaftAddr it serves (peers check it against the address they dial)
	// and allow client auth. Every NodeHost of a shard must use TLS, with
	// the same CA. Nil: plaintext TCP.
	TLS *TLSFiles
}

// TLSFiles are the PEM files of mutual TLS between NodeHosts.
type TLSFiles struct {
	CAFile, CertFile, KeyFile string
}

func (c *Config) setDefaults() {
	if c.RTTMillisecond == 0 {
		c.RTTMillisecond = 50
	}
	if c.ElectionRTT == 0 {
		c.ElectionRTT = 10
	}
	if c.HeartbeatRTT == 0 {
		c.HeartbeatRTT = 1
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.SnapshotEntries > 0 && c.CompactionOverhead == 0 {
		c.CompactionOverhead = 100
	}
}

// Errors returned by Open.
var (
	ErrInvalidConfig   = errors.New("logstore: invalid config")
	ErrStoreIDMismatch = errors.New("logstore: data dir belongs to another store")
)

// ValidateRaftAddr checks that addr is an explicit host:port usable as a Raft
// identity: a non-empty, specified host and a port in 1..65535.
func ValidateRaftAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: raft address %q: %v", ErrInvalidConfig, addr, err)
	}
	if host == "" {
		return fmt.Errorf("%w: raft address %q has no host", ErrInvalidConfig, addr)
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return fmt.Errorf("%w: raft address %q is unspecified; a Raft address is an identity", ErrInvalidConfig, addr)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return fmt.Errorf("%w: raft address %q needs a port in 1..65535 (never 0)", ErrInvalidConfig, addr)
	}
	if !dbconfig.IsValidAddress(addr) {
		return fmt.Errorf("%w: raft address %q rejected by dragonboat", ErrInvalidConfig, addr)
	}
	return nil
}

func (c *Config) validate() error {
	if strings.TrimSpace(c.StoreID) == "" {
		return fmt.Errorf("%w: empty store id", ErrInvalidConfig)
	}
	if c.DataDir == "" {
		return fmt.Errorf("%w: empty data dir", ErrInvalidConfig)
	}
	if err := ValidateRaftAddr(c.RaftAddr); err != nil {
		return err
	}
	switch c.LogDB {
	case "", LogDBTiny, LogDBDefault:
	default:
		return fmt.Errorf("%w: LogDB %q (want %q or %q)", ErrInvalidConfig, c.LogDB, LogDBTiny, LogDBDefault)
	}
	if c.ElectionRTT <= 2*c.HeartbeatRTT {
		return fmt.Errorf("%w: ElectionRTT %d must be more than twice HeartbeatRTT %d", ErrInvalidConfig, c.ElectionRTT, c.HeartbeatRTT)
	}
	if t := c.TLS; t != nil && (t.CAFile == "" || t.CertFile == "" || t.KeyFile == "") {
		return fmt.Errorf("%w: Raft TLS needs a CA, a certificate and a key file (got %+v)", ErrInvalidConfig, *t)
	}
	return nil
}

// storeFile is the persistent identity of a data dir.
const storeFileName = "store.json"

type storeFile struct {
	StoreID  string `json:"store_id"`
	RaftAddr string `json:"raft_addr"`
	LogDB    string `json:"logdb"`
}

// claimDataDir creates or checks DataDir/store.json and returns the LogDB
// profile to use.
func claimDataDir(cfg Config) (string, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return "", fmt.Errorf("logstore: data dir: %w", err)
	}
	path := filepath.Join(cfg.DataDir, storeFileName)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		var sf storeFile
		if err := json.Unmarshal(b, &sf); err != nil {
			return "", fmt.Errorf("logstore: %s is corrupt: %w", path, err)
		}
		if sf.StoreID != cfg.StoreID {
			return "", fmt.Errorf("%w: %s was created by store %q, not %q", ErrStoreIDMismatch, cfg.DataDir, sf.StoreID, cfg.StoreID)
		}
		if sf.RaftAddr != "" && sf.RaftAddr != cfg.RaftAddr {
			return "", fmt.Errorf("%w: %s was created with raft address %s, not %s (the address is the NodeHost's identity)", ErrInvalidConfig, cfg.DataDir, sf.RaftAddr, cfg.RaftAddr)
		}
		if cfg.LogDB != "" && sf.LogDB != "" && cfg.LogDB != sf.LogDB {
			return "", fmt.Errorf("%w: %s was created with LogDB %q, not %q (a hard setting)", ErrInvalidConfig, cfg.DataDir, sf.LogDB, cfg.LogDB)
		}
		if sf.LogDB != "" {
			return sf.LogDB, nil
		}
		return orTiny(cfg.LogDB), nil
	case errors.Is(err, os.ErrNotExist):
		sf := storeFile{StoreID: cfg.StoreID, RaftAddr: cfg.RaftAddr, LogDB: orTiny(cfg.LogDB)}
		if err := writeFileAtomic(path, sf); err != nil {
			return "", err
		}
		return sf.LogDB, nil
	default:
		return "", fmt.Errorf("logstore: %w", err)
	}
}

func orTiny(s string) string {
	if s == "" {
		return LogDBTiny
	}
	return s
}

func writeFileAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("logstore: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("logstore: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("logstore: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("logstore: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("logstore: %w", err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

func expertConfig(profile string) dbconfig.ExpertConfig {
	if profile == LogDBDefault {
		return dbconfig.GetDefaultExpertConfig()
	}
	ldb := dbconfig.GetTinyMemLogDBConfig()
	ldb.Shards = 1
	ldb.KVWriteBufferSize = 256 * 1024
	ldb.KVMaxWriteBufferNumber = 2
	ldb.KVMaxBackgroundCompactions = 1
	ldb.KVMaxBackgroundFlushes = 1
	ldb.KVKeepLogFileNum = 4
	ldb.SaveBufferSize = 4 * 1024
	ldb.MaxSaveBufferSize = 1024 * 1024
	return dbconfig.ExpertConfig{
		LogDB: ldb,
		Engine: dbconfig.EngineConfig{
			ExecShards:     1,
			CommitShards:   1,
			ApplyShards:    1,
			SnapshotShards: 1,
			CloseShards:    1,
		},
	}
}

// Host is one store's NodeHost. Its methods are safe for concurrent use.
type Host struct {
	cfg   Config
	logDB string
	nhc   dbconfig.NodeHostConfig
	// nh is the NodeHost; Rebuild replaces it (under mu) by one reopened on
	// the same directories. A call on the closed one meanwhile fails with
	// dragonboat.ErrClosed.
	nh atomic.Pointer[dragonboat.NodeHost]
	// nhMu guards the NodeHost against Rebuild's close and swap: a call
	// made without mu holds it for reading (dragonboat's NodeHost is not
	// safe to use while it closes). Under mu no lock is needed: Rebuild
	// holds mu throughout.
	nhMu   sync.RWMutex
	logger zerolog.Logger
	clock  clock.Clock

	// mu serialises replica lifecycle changes (start, stop, remove data) so
	// that "has bootstrap info?" and StartReplica are one step.
	mu sync.Mutex
}

// Open claims DataDir for cfg.StoreID and starts the NodeHost.
func Open(cfg Config) (*Host, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	profile, err := claimDataDir(cfg)
	if err != nil {
		return nil, err
	}
	nhc := dbconfig.NodeHostConfig{
		WALDir:         filepath.Join(cfg.DataDir, "wal"),
		NodeHostDir:    filepath.Join(cfg.DataDir, "nodehost"),
		RTTMillisecond: cfg.RTTMillisecond,
		RaftAddress:    cfg.RaftAddr,
		Expert:         expertConfig(profile),
	}
	if t := cfg.TLS; t != nil {
		nhc.MutualTLS, nhc.CAFile, nhc.CertFile, nhc.KeyFile = true, t.CAFile, t.CertFile, t.KeyFile
	}
	nh, err := dragonboat.NewNodeHost(nhc)
	if err != nil {
		return nil, fmt.Errorf("logstore: open NodeHost at %s for %s: %w", cfg.DataDir, cfg.RaftAddr, err)
	}
	h := &Host{
		cfg:    cfg,
		logDB:  profile,
		nhc:    nhc,
		clock:  cfg.Clock,
		logger: cfg.Logger.With().Str("store", cfg.StoreID).Str("raft_addr", cfg.RaftAddr).Logger(),
	}
	h.nh.Store(nh)
	h.logger.Info().Str("logdb", profile).Str("data_dir", cfg.DataDir).Bool("tls", cfg.TLS != nil).Msg("NodeHost started")
	return h, nil
}

// Close stops every replica and the NodeHost.
func (h *Host) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nodeHost().Close()
}

// nodeHost is the NodeHost, for callers holding mu or nhMu.
func (h *Host) nodeHost() *dragonboat.NodeHost { return h.nh.Load() }

// acquire holds the NodeHost for a call made without mu; call release after.
func (h *Host) acquire() (*dragonboat.NodeHost, func()) {
	h.nhMu.RLock()
	return h.nh.Load(), h.nhMu.RUnlock
}

// StoreID is the store's id.
func (h *Host) StoreID() string { return h.cfg.StoreID }

// RaftAddr is the NodeHost's Raft address.
func (h *Host) RaftAddr() string { return h.cfg.RaftAddr }

// LogDB is the LogDB profile in use.
func (h *Host) LogDB() string { return h.logDB }

// rtt is one Raft tick.
func (h *Host) rtt() time.Duration { return time.Duration(h.cfg.RTTMillisecond) * time.Millisecond }

// electionTimeout is the Raft election timeout.
func (h *Host) electionTimeout() time.Duration {
	return time.Duration(h.cfg.ElectionRTT) * h.rtt()
}

// dragonboatLoggers are the names of dragonboat's process-global loggers.
var dragonboatLoggers = []string{
	"config", "dragonboat", "gossip", "grpc", "logdb", "LogDB", "pebblekv", "raft",
	"raft-mt", "raftpb", "registry", "rsm", "server", "settings", "tan", "tools", "transport",
}

// SetDragonboatLogLevel sets the level of every dragonboat logger: "debug",
// "info", "warning", "error" or "critical". Dragonboat's loggers are
// process-global: call this once from main (or TestMain), never from a
// library path.
func SetDragonboatLogLevel(level string) error {
	var l dblogger.LogLevel
	switch strings.ToLower(level) {
	case "debug":
		l = dblogger.DEBUG
	case "info":
		l = dblogger.INFO
	case "warning", "warn":
		l = dblogger.WARNING
	case "error":
		l = dblogger.ERROR
	case "critical":
		l = dblogger.CRITICAL
	default:
		return fmt.Errorf("logstore: unknown dragonboat log level %q", level)
	}
	for _, name := range dragonboatLoggers {
		dblogger.GetLogger(name).SetLevel(l)
	}
	return nil
}
