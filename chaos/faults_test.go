package chaos

import (
	"strings"
	"testing"
)

// Every fault kind is one complete row: Generate draws it, runStep finds
// its victim and injects it, and the row says what recovery from it means.
func TestFaultTableRows(t *testing.T) {
	seen := map[Fault]bool{}
	for _, k := range faultTable {
		switch {
		case seen[k.fault]:
			t.Errorf("%s: two rows", k.fault)
		case k.draw == nil || k.aim == nil || k.inject == nil:
			t.Errorf("%s: row lacks draw, aim or inject", k.fault)
		case strings.TrimSpace(k.recovery) == "":
			t.Errorf("%s: row does not say what recovery means", k.fault)
		case k.partition && k.heal == nil:
			t.Errorf("%s: a partition must heal its cuts", k.fault)
		}
		seen[k.fault] = true
	}
	for _, f := range Faults {
		if kindOf(f).fault != f {
			t.Errorf("%s: no row", f)
		}
	}
	if len(Faults) != len(faultTable) {
		t.Errorf("Faults lists %d kinds, the table %d", len(Faults), len(faultTable))
	}
}

// A step names its target by its row's unit.
func TestStepStringUnits(t *testing.T) {
	for st, want := range map[Step]string{
		{Fault: WorkerKill, Target: 1}:        "+0s worker-kill-restart worker-2 hold 0s",
		{Fault: StoreReplaced, Target: 0}:     "+0s store-down-replaced store-1 hold 0s",
		{Fault: PartitionNATSNode, Target: 2}: "+0s partition-nats-node nats-3 hold 0s",
		{Fault: MetaLeaderPause, Target: 2}:   "+0s meta-leader-pause hold 0s",
		{Fault: StoreRapidRestart, Repeat: 3}: "+0s store-rapid-restart store-1 hold 0s x3",
	} {
		if got := st.String(); got != want {
			t.Errorf("%+v: %q, want %q", st, got, want)
		}
	}
}
