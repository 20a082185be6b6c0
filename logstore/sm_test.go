package logstore

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	sm "github.com/lni/dragonboat/v4/statemachine"
)

func TestLogSMSnapshotRoundTrip(t *testing.T) {
	a := newLogSM(1, 1)
	for i := range 3000 {
		r, err := a.Update(sm.Entry{Index: uint64(i + 1), Cmd: []byte(fmt.Sprintf("e%d", i+1))})
		if err != nil || r.Value != uint64(i+1) {
			t.Fatalf("update %d: %v %v", i, r, err)
		}
	}
	if _, err := a.Update(sm.Entry{Cmd: nil}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := a.SaveSnapshot(&buf, nil, make(chan struct{})); err != nil {
		t.Fatal(err)
	}
	b := newLogSM(1, 2)
	if err := b.RecoverFromSnapshot(bytes.NewReader(buf.Bytes()), nil, make(chan struct{})); err != nil {
		t.Fatal(err)
	}
	n, err := b.Lookup("count")
	if err != nil || n.(uint64) != 3001 {
		t.Fatalf("count %v %v", n, err)
	}
	v, err := b.Lookup("get 2999")
	if err != nil || string(v.([]byte)) != "e2999" {
		t.Fatalf("get: %q %v", v, err)
	}
	v, err = b.Lookup(GetQuery{Index: 3001})
	if err != nil || len(v.([]byte)) != 0 {
		t.Fatalf("empty entry: %q %v", v, err)
	}
	if _, err := b.Lookup(GetQuery{Index: 3002}); !errors.Is(err, ErrNoEntry) {
		t.Fatalf("out of range: %v", err)
	}
	if _, err := b.Lookup(GetQuery{}); !errors.Is(err, ErrNoEntry) {
		t.Fatalf("index 0: %v", err)
	}
	for _, q := range []any{"nope", "get x", 42, "get"} {
		if _, err := b.Lookup(q); err == nil {
			t.Fatalf("query %v: want an error", q)
		}
	}
	if n, _ := b.Lookup(CountQuery{}); n.(uint64) != 3001 {
		t.Fatal(n)
	}
}

func TestLogSMRecoverRejectsGarbage(t *testing.T) {
	s := newLogSM(1, 1)
	for _, snap := range [][]byte{
		{},
		{0, 0, 0, 0, 0, 0, 0, 1},
		{0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5, 'a'},
	} {
		if err := s.RecoverFromSnapshot(bytes.NewReader(snap), nil, make(chan struct{})); err == nil {
			t.Fatalf("snapshot %v: want an error", snap)
		}
	}
	done := make(chan struct{})
	close(done)
	a := newLogSM(1, 1)
	a.Update(sm.Entry{Cmd: []byte("x")})
	if err := a.SaveSnapshot(&bytes.Buffer{}, nil, done); !errors.Is(err, sm.ErrSnapshotStopped) {
		t.Fatalf("stopped save: %v", err)
	}
}
