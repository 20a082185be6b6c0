package history

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const timeout = 5 * time.Second

// h builds doctored histories; times are in milliseconds.
type h []Op

func (x *h) add(cl string, call, ret int, in Input, out Output) *h {
	*x = append(*x, Op{Client: cl, Input: in, Output: out, Call: ms(call), Return: ms(ret), Done: true})
	return x
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func (x *h) reg(cl string, call, ret int, ep, inc string, id, epoch uint64) *h {
	return x.add(cl, call, ret, Input{Kind: Register, Endpoint: ep, Incarnation: inc}, Output{Outcome: OK, ID: id, Epoch: epoch})
}

func (x *h) regUnknown(cl string, call int, ep, inc string) *h {
	*x = append(*x, Op{Client: cl, Input: Input{Kind: Register, Endpoint: ep, Incarnation: inc}, Output: Output{Outcome: Unknown, Err: "timeout"}, Call: ms(call)})
	return x
}

func (x *h) hb(cl string, call, ret int, id, epoch uint64, o Outcome) *h {
	return x.add(cl, call, ret, Input{Kind: Heartbeat, ID: id, Epoch: epoch}, Output{Outcome: o})
}

func (x *h) dereg(cl string, call, ret int, id, epoch uint64, o Outcome) *h {
	return x.add(cl, call, ret, Input{Kind: Deregister, ID: id, Epoch: epoch}, Output{Outcome: o})
}

// read lists workers as "id@endpoint/incarnation/epoch".
func (x *h) read(cl string, call, ret int, seq uint64, ws ...string) *h {
	out := Output{Outcome: OK, Seq: seq}
	for _, w := range ws {
		var wk Worker
		if _, err := fmt.Sscanf(strings.NewReplacer("@", " ", "/", " ").Replace(w), "%d %s %s %d", &wk.ID, &wk.Endpoint, &wk.Incarnation, &wk.Epoch); err != nil {
			panic(fmt.Sprintf("bad worker %q: %v", w, err))
		}
		out.Workers = append(out.Workers, wk)
	}
	return x.add(cl, call, ret, Input{Kind: Read}, out)
}

func check(t *testing.T, x h) error {
	t.Helper()
	_, err := Check(x, Options{WorkerTimeout: timeout, Timeout: 20 * time.Second})
	if errors.Is(err, ErrUndecided) {
		t.Fatalf("undecided: %v", err)
	}
	return err
}

func TestLinearizableHistories(t *testing.T) {
	for name, x := range map[string]*h{
		// Two workers register concurrently; a read overlapping both
		// shows one of them, a later read both.
		"concurrent registrations": new(h).
			reg("w1", 0, 30, "a:1", "i1", 1, 3).
			reg("w2", 5, 25, "b:1", "i2", 2, 4).
			read("r", 10, 20, 3, "1@a:1/i1/3").
			read("r", 40, 50, 4, "1@a:1/i1/3", "2@b:1/i2/4"),
		// A restarted worker (new incarnation) at the same endpoint gets
		// a new id that replaces the old one; the old one's heartbeat is
		// told to re-register.
		"restart at the same endpoint": new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			hb("w1", 100, 110, 1, 3, OK).
			reg("w1b", 200, 210, "a:1", "i1b", 2, 7).
			hb("w1", 220, 230, 1, 3, Reregister).
			read("r", 240, 250, 7, "2@a:1/i1b/7"),
		// The same incarnation retrying gets its id back.
		"retry gets the same id": new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			reg("w1", 20, 30, "a:1", "i1", 1, 3).
			read("r", 40, 50, 3, "1@a:1/i1/3"),
		// Deregistered, then gone from reads.
		"deregister": new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			dereg("w1", 20, 30, 1, 3, OK).
			read("r", 40, 50, 5),
		// A read overlapping the deregistration may still show it.
		"read concurrent with deregister": new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			dereg("w1", 20, 60, 1, 3, OK).
			read("r", 30, 40, 4, "1@a:1/i1/3").
			read("r", 70, 80, 5),
		// Expired: no heartbeat for longer than the timeout.
		"expiry": new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			hb("w1", 1000, 1010, 1, 3, OK).
			read("r", 2000, 2010, 3, "1@a:1/i1/3").
			read("r", 7000, 7010, 4),
		// A heartbeat told to re-register after the timeout, then the same
		// incarnation registers again while the expiry is not yet applied.
		"reregister after timeout": new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			hb("w1", 6000, 6010, 1, 3, Reregister).
			reg("w1", 6020, 6030, "a:1", "i1", 1, 3).
			read("r", 6040, 6050, 3, "1@a:1/i1/3").
			read("r", 6060, 6070, 4),
		// A deregistration whose reply was lost may have happened.
		"unknown deregister": new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			add("w1", 20, 25, Input{Kind: Deregister, ID: 1, Epoch: 3}, Output{Outcome: Unknown}).
			read("r", 30, 40, 3, "1@a:1/i1/3").
			read("r", 50, 60, 4),
		// A registration whose reply was lost shows up in a read.
		"unknown register": new(h).
			regUnknown("w1", 0, "a:1", "i1").
			read("r", 30, 40, 3, "1@a:1/i1/3").
			reg("w1", 50, 60, "a:1", "i1", 1, 3),
		// Two readers overlapping each other may see seqs in either order.
		"overlapping reads": new(h).
			read("r1", 0, 50, 9).
			read("r2", 10, 20, 8),
	} {
		t.Run(name, func(t *testing.T) {
			if err := check(t, *x); err != nil {
				t.Fatalf("want linearizable, got %v", err)
			}
		})
	}
}

// Each property of the model violated once: the checker says not
// linearizable, and why.
func TestViolations(t *testing.T) {
	for name, c := range map[string]struct {
		x    *h
		want string
	}{
		"reused id": {new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			dereg("w1", 20, 30, 1, 3, OK).
			reg("w2", 40, 50, "b:1", "i2", 1, 6), "reused"},
		"reused id seen in a read": {new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			read("r", 20, 30, 6, "1@b:1/i2/6"), "reused"},
		"two active ids at one endpoint": {new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			reg("w1b", 20, 30, "a:1", "i1b", 2, 4).
			read("r", 40, 50, 4, "1@a:1/i1/3", "2@a:1/i1b/4"), "two active ids at endpoint a:1"},
		"a replaced id's heartbeat accepted": {new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			reg("w1b", 20, 30, "a:1", "i1b", 2, 4).
			hb("w1", 40, 50, 1, 3, OK), "accepted after it was removed"},
		"acknowledged registration missing": {new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			hb("w1", 1000, 1010, 1, 3, OK).
			read("r", 2000, 2010, 3), "missing"},
		"removed registration back": {new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			dereg("w1", 20, 30, 1, 3, OK).
			read("r", 40, 50, 4, "1@a:1/i1/3"), "again after it was removed"},
		"read goes back in seq": {new(h).
			read("r1", 0, 10, 9).
			read("r2", 20, 30, 8), "went back"},
		"read behind an acknowledged registration": {new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 7).
			read("r", 20, 30, 5), "went back"},
		"reregister before the timeout": {new(h).
			reg("w1", 0, 10, "a:1", "i1", 1, 3).
			hb("w1", 1000, 1010, 1, 3, Reregister), "re-register"},
	} {
		t.Run(name, func(t *testing.T) {
			err := check(t, *c.x)
			if !errors.Is(err, ErrNotLinearizable) {
				t.Fatalf("want not linearizable, got %v", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error does not say %q:\n%v", c.want, err)
			}
			t.Logf("%v", err)
		})
	}
}

func TestVisualisationSaved(t *testing.T) {
	dir := t.TempDir()
	x := *new(h).
		reg("w1", 0, 10, "a:1", "i1", 1, 3).
		read("r", 20, 30, 2)
	res, err := Check(x, Options{WorkerTimeout: timeout, Dir: filepath.Join(dir, "out")})
	if !errors.Is(err, ErrNotLinearizable) || !strings.Contains(err.Error(), res.Visual) {
		t.Fatalf("want not linearizable naming the visualisation, got %v", err)
	}
	b, err := os.ReadFile(res.Visual)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "<html") || !strings.Contains(string(b), "register(a:1, i1)") {
		t.Fatalf("visualisation lacks the page or the operation: %.200s", b)
	}
	f, err := os.Open(filepath.Join(dir, "out", "history.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back, err := ReadJSONL(f)
	if err != nil || len(back) != len(x) || back[0].Output.ID != 1 || back[1].Output.Seq != 2 {
		t.Fatalf("saved history %+v, %v", back, err)
	}
}
