package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/termlog/termlog/internal/wire"
)

// RPC subjects, served by the meta leader only (core NATS request/reply).
const (
	RPCRegister   = wire.RPCRegister
	RPCActivate   = wire.RPCActivate
	RPCHeartbeat  = wire.RPCHeartbeat
	RPCDeregister = wire.RPCDeregister
	RPCStepDown   = wire.RPCStepDown // ask the leader to give up its lease
)

// RPCSubject is the subject of one RPC in a cluster.
func RPCSubject(cluster, rpc string) string { return wire.RPC(cluster, rpc) }

// MaxRequestBytes bounds an RPC request; larger ones are refused unread.
const MaxRequestBytes = 4096

// Error codes in replies.
const (
	CodeBadRequest  = "bad_request" // the request is malformed; do not retry it as is
	CodeReregister  = "reregister"  // unknown or expired id: register again
	CodeForbidden   = "forbidden"   // the id and epoch belong to another incarnation
	CodeNotLeader   = "not_leader"  // ask the leader; Leader names it when known
	CodeUnavailable = "unavailable" // transient: retry with backoff
)

// RPCError is the error part of a reply.
type RPCError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *RPCError) Error() string { return e.Code + ": " + e.Message }

// Reply errors matched with errors.Is.
var (
	// ErrReregister is matched by a reply telling the worker to register again.
	ErrReregister = errors.New("worker must re-register")
	// ErrForbidden is matched by a reply refusing a request that names
	// another incarnation's registration.
	ErrForbidden = errors.New("registration belongs to another incarnation")
)

// Is lets errors.Is match ErrReregister and ErrForbidden to their codes.
func (e *RPCError) Is(target error) bool {
	return target == ErrReregister && e.Code == CodeReregister ||
		target == ErrForbidden && e.Code == CodeForbidden
}

// RegisterRequest asks for a worker id.
type RegisterRequest struct {
	Incarnation string `json:"incarnation"`
	Endpoint    string `json:"endpoint"`
	Kind        string `json:"kind"`
	Parallelism int    `json:"parallelism"`
}

// WorkerRef names one registration: the id and its epoch, and the
// incarnation that registered it. Activate, heartbeat and deregister
// requests carry all three; the leader refuses (CodeForbidden) a request
// whose incarnation is not the one projected for that id and epoch, so a
// process cannot keep alive, activate or remove another's registration.
type WorkerRef struct {
	ID          uint64 `json:"id"`
	Epoch       uint64 `json:"epoch"`
	Incarnation string `json:"incarnation"`
}

// Reply answers every RPC.
type Reply struct {
	ID     uint64    `json:"id,omitempty"`
	Epoch  uint64    `json:"epoch,omitempty"`
	Term   uint64    `json:"term"`
	Leader string    `json:"leader,omitempty"`
	Error  *RPCError `json:"error,omitempty"`
	// Recovery is shard.recover's plan (and, once done, its seq).
	Recovery *RecoveryPlan `json:"recovery,omitempty"`
}

func decodeStrict(b []byte, v any) error { return decodeStrictN(b, v, MaxRequestBytes) }

func decodeStrictN(b []byte, v any, limit int) error {
	if len(b) > limit {
		return fmt.Errorf("request of %d bytes exceeds %d", len(b), limit)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed request: %v", err)
	}
	if dec.More() {
		return errors.New("malformed request: trailing data")
	}
	return nil
}

// MaxFieldBytes bounds free-text fields of a registration.
const MaxFieldBytes = 256

// DecodeRegister decodes and validates a registration request.
func DecodeRegister(b []byte) (RegisterRequest, error) {
	var r RegisterRequest
	if err := decodeStrict(b, &r); err != nil {
		return RegisterRequest{}, err
	}
	if r.Incarnation == "" || len(r.Incarnation) > MaxFieldBytes {
		return RegisterRequest{}, errors.New("incarnation must be 1..256 bytes")
	}
	if len(r.Kind) > MaxFieldBytes {
		return RegisterRequest{}, errors.New("kind longer than 256 bytes")
	}
	if err := ValidateEndpoint(r.Endpoint); err != nil {
		return RegisterRequest{}, err
	}
	if r.Parallelism < 0 || r.Parallelism > 1<<16 {
		return RegisterRequest{}, fmt.Errorf("parallelism %d out of range 0..65536", r.Parallelism)
	}
	return r, nil
}

// DecodeWorkerRef decodes and validates an id+epoch+incarnation request.
func DecodeWorkerRef(b []byte) (WorkerRef, error) {
	var r WorkerRef
	if err := decodeStrict(b, &r); err != nil {
		return WorkerRef{}, err
	}
	if r.ID == 0 || r.Epoch == 0 {
		return WorkerRef{}, errors.New("id and epoch are required")
	}
	if r.Incarnation == "" || len(r.Incarnation) > MaxFieldBytes {
		return WorkerRef{}, errors.New("incarnation must be 1..256 bytes")
	}
	return r, nil
}

// DecodeStepDown validates a step-down request: an empty JSON object,
// nothing else, so that no stray message deposes the leader.
func DecodeStepDown(b []byte) error {
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return errors.New("malformed request: want {}")
	}
	var r struct{}
	return decodeStrict(b, &r)
}

// ValidateEndpoint accepts "host:port" with a non-empty host and a port in 1..65535.
func ValidateEndpoint(ep string) error {
	if len(ep) > MaxFieldBytes {
		return errors.New("endpoint longer than 256 bytes")
	}
	host, port, err := net.SplitHostPort(ep)
	if err != nil {
		return fmt.Errorf("endpoint %q: %v", ep, err)
	}
	if host == "" {
		return fmt.Errorf("endpoint %q: empty host", ep)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("endpoint %q: port must be 1..65535", ep)
	}
	return nil
}
