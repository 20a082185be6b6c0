package console

import (
	"fmt"
	"testing"

	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/sched"
)

func TestBanners(t *testing.T) {
	members := map[uint64]string{1: "store-1", 2: "store-2", 3: "store-3"}
	shard := func(leader uint64, running ...uint64) sched.ShardHealth {
		return sched.ShardHealth{Shard: 1, Expected: 3, Members: members, Running: running, Live: len(running), Leader: leader}
	}
	rec := func(collecting []string, shards ...sched.ShardHealth) *meta.HealthRecord {
		return &meta.HealthRecord{Health: sched.Health{Shards: shards, Collecting: collecting}}
	}
	for _, tc := range []struct {
		name   string
		holder string
		rec    *meta.HealthRecord
		want   string
	}{
		{"healthy", "meta-1", rec(nil, shard(2, 1, 2, 3)), "[]"},
		{"no lease holder", "", nil, "[{no-leader 0 0 0 []}]"},
		{"one stopped keeps the quorum", "meta-1", rec(nil, shard(2, 1, 2)), "[]"},
		{"two stopped", "meta-1", rec(nil, shard(2, 1)), "[{no-quorum 1 1 3 [2@store-2 3@store-3]}]"},
		// A new leader has not heard from store-1 yet: its replica may
		// run, so the shard is not known to be short (the CI failure of
		// TestConsoleInChromium: the banner named store-1, which ran).
		{"unheard store may run", "meta-1", rec([]string{"store-1"}, shard(2, 2)), "[]"},
		{"unheard does not make a quorum alone", "meta-1", rec([]string{"store-1"}, shard(0)), "[{no-quorum 1 0 3 [2@store-2 3@store-3]}]"},
		{"no raft leader with a quorum", "meta-1", rec(nil, shard(0, 1, 2)), "[{no-raft-leader 1 0 0 []}]"},
		{"no raft leader while collecting", "meta-1", rec([]string{"store-3"}, shard(0, 1)), "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := banners(tc.holder, "", tc.rec)
			if s := fmt.Sprint(fmtBanners(got)); s != tc.want {
				t.Errorf("banners = %s, want %s", s, tc.want)
			}
		})
	}
}

func fmtBanners(bs []Banner) []string {
	out := []string{}
	for _, b := range bs {
		out = append(out, fmt.Sprintf("{%s %d %d %d %v}", b.Kind, b.Shard, b.Running, b.Expected, b.Stopped))
	}
	return out
}
