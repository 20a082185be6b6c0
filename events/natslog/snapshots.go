package natslog

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/wire"
)

// SnapshotBucket is the object store bucket of a cluster's projection
// snapshots. An object store, not a KV bucket: the snapshot of a cluster
// with 10,000 workers is about 1.8 MB, beyond the 1 MB message limit of a
// KV value; the object store chunks it.
func SnapshotBucket(cluster string) string { return wire.SnapshotBucket(cluster) }

// Snapshots is an events.SnapshotStore in the JetStream object store
// <cluster>_snapshots, next to the stream of a Log. Each object is named
// events.SnapshotName(seq) (names sort by seq) and carries its SnapshotInfo
// as object metadata, so List reads no snapshot bytes.
type Snapshots struct {
	log *Log
	obs jetstream.ObjectStore
}

var _ events.SnapshotStore = (*Snapshots)(nil)

// Metadata keys of a snapshot object.
const (
	mdSeq        = "seq"
	mdTerm       = "term"
	mdHash       = "hash"
	mdRules      = "rules"
	mdStream     = "stream"
	mdWriter     = "writer"
	mdLeaderTerm = "leader-term"
	mdAt         = "at"
)

// Bounds implements events.SnapshotStore: the stream's creation time is its
// identity.
func (s *Snapshots) Bounds(ctx context.Context) (events.StreamBounds, error) {
	info, err := s.log.info(ctx)
	if err != nil {
		return events.StreamBounds{}, err
	}
	return events.StreamBounds{ID: streamID(info), FirstSeq: info.State.FirstSeq, LastSeq: info.State.LastSeq}, nil
}

func streamID(info *jetstream.StreamInfo) string {
	return info.Created.UTC().Format(time.RFC3339Nano)
}

// Put implements events.SnapshotStore. It stamps the snapshot with the
// stream's identity as it is now.
func (s *Snapshots) Put(ctx context.Context, si events.SnapshotInfo, data []byte) (events.SnapshotInfo, error) {
	info, err := s.log.info(ctx)
	if err != nil {
		return events.SnapshotInfo{}, err
	}
	if info.State.LastSeq < si.Seq {
		return events.SnapshotInfo{}, fmt.Errorf("natslog: put snapshot at seq %d: stream %s ends at seq %d: not the stream it was folded from", si.Seq, s.log.name, info.State.LastSeq)
	}
	si.Name, si.Stream, si.Size = events.SnapshotName(si.Seq), streamID(info), len(data)
	if si.At.IsZero() {
		si.At = time.Now().UTC()
	}
	ctx, cancel := s.log.reqCtx(ctx)
	defer cancel()
	meta := jetstream.ObjectMeta{
		Name:        si.Name,
		Description: fmt.Sprintf("projection of %s after seq %d", s.log.name, si.Seq),
		Metadata: map[string]string{
			mdSeq: strconv.FormatUint(si.Seq, 10), mdTerm: strconv.FormatUint(si.Term, 10), mdHash: si.Hash,
			mdRules:  strconv.FormatUint(si.Rules, 10),
			mdStream: si.Stream, mdWriter: si.Writer, mdLeaderTerm: strconv.FormatUint(si.LeaderTerm, 10),
			mdAt: si.At.UTC().Format(time.RFC3339Nano),
		},
	}
	if err := s.putObject(ctx, meta, data); err != nil {
		return events.SnapshotInfo{}, fmt.Errorf("natslog: put snapshot %s: %w", si.Name, err)
	}
	return si, nil
}

// listAttempt bounds one attempt of a snapshot list or delete (a few
// requests each: a consumer and its messages, or a purge and a publish);
// Get's attempts are bounded by Config.RequestTimeout (a snapshot of
// 10,000 workers is 14 chunks).
const listAttempt = 2 * time.Second

// Object store layout (the one jetstream.ObjectStore reads: ADR-20).
const (
	objChunkSize   = 128 * 1024
	objChunkSubj   = "$O.%s.C.%s" // bucket, object nuid
	objMetaSubj    = "$O.%s.M.%s" // bucket, base64url(name)
	objStreamPre   = "OBJ_"
	objDigestLabel = "SHA-256="
)

// putObject stores data as an object the way jetstream.ObjectStore.Put
// does (chunks on a fresh subject, then the info with a subject rollup,
// then the old chunks purged), but with synchronous publishes:
// ObjectStore.Put of nats.go v1.55.0 publishes asynchronously on a
// throwaway JetStream context whose reconnect watcher goroutine can start
// after Put has cleaned the context up, and then blocks forever on a nil
// channel (a goroutine leaked per Put, seen by goleak). Reads, lists and
// deletes use the ObjectStore API.
func (s *Snapshots) putObject(ctx context.Context, meta jetstream.ObjectMeta, data []byte) error {
	bucket := SnapshotBucket(s.log.cluster)
	old, err := s.obs.GetInfo(ctx, meta.Name, jetstream.GetObjectInfoShowDeleted())
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return err
	}
	id := make([]byte, 11)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	nuid := hex.EncodeToString(id)
	chunkSubj := fmt.Sprintf(objChunkSubj, bucket, nuid)
	stream := jetstream.WithExpectStream(objStreamPre + bucket)
	// purge cleans up chunks nothing points to. It runs on its own short
	// context: a Put that failed because ctx ended must still clean up.
	purge := func(subj string) {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
		defer cancel()
		if st, err := s.log.js.Stream(pctx, objStreamPre+bucket); err == nil {
			_ = st.Purge(pctx, jetstream.WithPurgeSubject(subj))
		}
	}
	sum := sha256.New()
	chunks := 0
	for off := 0; off < len(data); off += objChunkSize {
		chunk := data[off:min(off+objChunkSize, len(data))]
		sum.Write(chunk)
		if _, err := s.log.js.PublishMsg(ctx, &nats.Msg{Subject: chunkSubj, Data: chunk}, stream); err != nil {
			purge(chunkSubj)
			return err
		}
		chunks++
	}
	meta.Opts = &jetstream.ObjectMetaOptions{ChunkSize: objChunkSize}
	info := jetstream.ObjectInfo{
		ObjectMeta: meta, Bucket: bucket, NUID: nuid, Size: uint64(len(data)), Chunks: uint32(chunks),
		ModTime: time.Now().UTC(), Digest: objDigestLabel + base64.URLEncoding.EncodeToString(sum.Sum(nil)),
	}
	b, err := json.Marshal(info)
	if err != nil {
		purge(chunkSubj)
		return err
	}
	mm := nats.NewMsg(fmt.Sprintf(objMetaSubj, bucket, base64.URLEncoding.EncodeToString([]byte(meta.Name))))
	mm.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	mm.Data = b
	if _, err := s.log.js.PublishMsg(ctx, mm, stream); err != nil {
		purge(chunkSubj)
		return err
	}
	if old != nil && !old.Deleted && old.NUID != "" {
		purge(fmt.Sprintf(objChunkSubj, bucket, old.NUID))
	}
	return nil
}

// List implements events.SnapshotStore. An object whose metadata does not
// parse (or names another seq than its name) is listed with seq 0 and
// Unreadable saying why, so it is never loaded and is the first pruned.
func (s *Snapshots) List(ctx context.Context) ([]events.SnapshotInfo, error) {
	var objs []*jetstream.ObjectInfo
	err := s.log.askAgain(ctx, listAttempt, func(ctx context.Context) (err error) {
		objs, err = s.obs.List(ctx)
		return err
	})
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("natslog: list snapshots: %w", err)
	}
	out := make([]events.SnapshotInfo, 0, len(objs))
	for _, o := range objs {
		if o == nil || o.Deleted {
			continue
		}
		out = append(out, parseInfo(o))
	}
	events.SortSnapshots(out)
	return out, nil
}

func parseInfo(o *jetstream.ObjectInfo) events.SnapshotInfo {
	md := o.Metadata
	si := events.SnapshotInfo{Name: o.Name, Size: int(o.Size), Hash: md[mdHash], Writer: md[mdWriter]}
	var errs []string
	num := func(key string) uint64 {
		n, err := strconv.ParseUint(md[key], 10, 64)
		if err != nil {
			errs = append(errs, key)
		}
		return n
	}
	si.Seq, si.Term, si.LeaderTerm = num(mdSeq), num(mdTerm), num(mdLeaderTerm)
	if _, ok := md[mdRules]; ok { // absent: written before rules were recorded (0)
		si.Rules = num(mdRules)
	}
	at, err := time.Parse(time.RFC3339Nano, md[mdAt])
	if err != nil {
		errs = append(errs, mdAt)
	}
	si.At = at
	si.Stream = md[mdStream]
	switch {
	case len(errs) > 0:
		si.Unreadable = fmt.Sprintf("object metadata %s do not parse", strings.Join(errs, ", "))
	case si.Name != events.SnapshotName(si.Seq):
		si.Unreadable = fmt.Sprintf("object metadata name seq %d, not the seq of its name", si.Seq)
	}
	if si.Unreadable != "" {
		si.Seq = 0
	}
	return si
}

// Get implements events.SnapshotStore; the object store checks the bytes
// against their SHA-256 digest.
func (s *Snapshots) Get(ctx context.Context, name string) ([]byte, error) {
	var b []byte
	err := s.log.askAgain(ctx, s.log.cfg.RequestTimeout, func(ctx context.Context) (err error) {
		b, err = s.obs.GetBytes(ctx, name)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("natslog: get snapshot %s: %w", name, err)
	}
	return b, nil
}

// Delete implements events.SnapshotStore.
func (s *Snapshots) Delete(ctx context.Context, name string) error {
	err := s.log.askAgain(ctx, listAttempt, func(ctx context.Context) error {
		return s.obs.Delete(ctx, name)
	})
	if err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("natslog: delete snapshot %s: %w", name, err)
	}
	return nil
}
