package chaos

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Proc is one role process of the built binary. Its stdout and stderr
// go to one log file that every start appends to (with a marker line), so
// the log of a process restarted five times tells its whole story.
type Proc struct {
	Name    string
	Bin     string
	Args    []string
	Env     []string // appended to os.Environ()
	LogPath string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	paused  bool
	starts  int
	logFile *os.File
	ending  bool     // the harness signalled the current run to end
	unasked []string // runs that ended without the harness asking: how each ended
}

// Start runs the process. It is an error to start a running process.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s: %w (pid %d)", p.Name, ErrAlreadyRunning, p.cmd.Process.Pid)
	}
	f, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a signal to the test's group (Ctrl-C) does not
	// reach the roles twice, and they are ended by the harness only.
	//
	// No Pdeathsig: it fires when the OS *thread* that forked the child
	// exits, and chaos/netns ends threads on purpose (a goroutine switched
	// into a namespace exits locked, so its thread dies with it); a thread
	// that once forked a role may later be locked that way. Tried: every
	// role of a Netns cluster died a second after it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("%s: start: %w", p.Name, err)
	}
	p.starts++
	fmt.Fprintf(f, "=== chaos: start %d of %s, pid %d, at %s: %s %v\n", p.starts, p.Name, cmd.Process.Pid, time.Now().UTC().Format(time.RFC3339Nano), p.Bin, p.Args)
	done := make(chan struct{})
	p.cmd, p.done, p.paused, p.logFile, p.ending = cmd, done, false, f, false
	go func() {
		err := cmd.Wait()
		at := time.Now().UTC().Format(time.RFC3339Nano)
		fmt.Fprintf(f, "=== chaos: %s pid %d exited at %s: %v\n", p.Name, cmd.Process.Pid, at, err)
		f.Close()
		p.mu.Lock()
		if !p.ending {
			p.unasked = append(p.unasked, fmt.Sprintf("pid %d exited by itself at %s: %v", cmd.Process.Pid, at, err))
		}
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// Running reports whether the process was started and has not exited.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Paused reports whether the process is stopped with SIGSTOP.
func (p *Proc) Paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// Exited returns the channel closed when the current run exits (nil when
// never started).
func (p *Proc) Exited() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

// Pid is the current run's pid (0: not running).
func (p *Proc) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Kill sends SIGKILL and waits for the exit (a paused process dies too).
func (p *Proc) Kill() error { return p.end(syscall.SIGKILL, 10*time.Second) }

// Term sends SIGTERM and waits up to within for the exit, then kills.
func (p *Proc) Term(within time.Duration) error {
	err := p.end(syscall.SIGTERM, within)
	if err != nil {
		return p.Kill()
	}
	return nil
}

func (p *Proc) end(sig syscall.Signal, within time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	p.mu.Lock()
	if p.cmd == cmd {
		p.ending = true
	}
	p.mu.Unlock()
	if sig != syscall.SIGKILL {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: %v: %w", p.Name, sig, err)
	}
	select {
	case <-done:
	case <-time.After(within):
		return fmt.Errorf("%s: still running %s after %v", p.Name, within, sig)
	}
	p.mu.Lock()
	if p.cmd == cmd {
		p.cmd, p.paused = nil, false
	}
	p.mu.Unlock()
	return nil
}

// Reap forgets a run that exited by itself, so it can be started again.
// It reports whether the process had exited.
func (p *Proc) Reap() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return true
	}
	select {
	case <-p.done:
		p.cmd, p.paused = nil, false
		return true
	default:
		return false
	}
}

// ErrAlreadyRunning: Start of a process that has a current run.
var ErrAlreadyRunning = errors.New("already running")

// ErrNotRunning: the process has no current run (it was killed, or
// exited, and not started again).
var ErrNotRunning = errors.New("not running")

// Pause sends SIGSTOP.
func (p *Proc) Pause() error { return p.signal(syscall.SIGSTOP, true) }

// Resume sends SIGCONT.
func (p *Proc) Resume() error { return p.signal(syscall.SIGCONT, false) }

func (p *Proc) signal(sig syscall.Signal, paused bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s: %w", p.Name, ErrNotRunning)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("%s: %v: %w", p.Name, sig, err)
	}
	p.paused = paused
	return nil
}

// Starts is how many times the process was started.
func (p *Proc) Starts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts
}

// Unasked returns, and forgets, how each run that ended without the
// harness asking ended (a role that exits by itself is a failure: roles
// wait for NATS and retry; they never give up on their own).
func (p *Proc) Unasked() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.unasked
	p.unasked = nil
	return out
}
