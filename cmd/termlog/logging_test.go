package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// openPTY opens a pseudo-terminal pair (Linux): writes to the returned
// terminal are read from master.
func openPTY(t *testing.T) (master, term *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	var unlock int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Skipf("unlock pty: %v", e)
	}
	var n uint32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Skipf("pty number: %v", e)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("open pty: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}

// readLine reads what a terminal received up to its first newline.
func readLine(t *testing.T, master *os.File) string {
	t.Helper()
	if err := master.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var out []byte
	buf := make([]byte, 1024)
	for !bytes.Contains(out, []byte("\n")) {
		n, err := master.Read(buf)
		if err != nil {
			t.Fatalf("read pty after %q: %v", out, err)
		}
		out = append(out, buf[:n]...)
	}
	return string(out)
}

// TestLogFormat: auto is console at a terminal and JSON into anything else;
// the console has colours only at a terminal and without NO_COLOR; JSON
// timestamps have milliseconds and durations a unit.
func TestLogFormat(t *testing.T) {
	configureZerolog()
	master, term := openPTY(t)

	lg, err := newLogger(term, "auto", "info", false)
	if err != nil {
		t.Fatal(err)
	}
	lg.Info().Dur("took", 4688293*time.Nanosecond).Msg("hello")
	if line := readLine(t, master); !strings.Contains(line, "\x1b[") || strings.Contains(line, "{") || !strings.Contains(line, "hello") {
		t.Fatalf("auto at a terminal: %q, want coloured console", line)
	}
	lg, _ = newLogger(term, "auto", "info", true) // NO_COLOR
	lg.Info().Msg("plain")
	if line := readLine(t, master); strings.Contains(line, "\x1b[") || !strings.Contains(line, "plain") || strings.Contains(line, "{") {
		t.Fatalf("auto at a terminal with NO_COLOR: %q, want console without colours", line)
	}

	var pipe bytes.Buffer
	lg, _ = newLogger(&pipe, "console", "info", false)
	lg.Info().Msg("piped")
	if strings.Contains(pipe.String(), "\x1b[") || !strings.Contains(pipe.String(), "piped") {
		t.Fatalf("console into a pipe: %q, want no colours", pipe.String())
	}
	pipe.Reset()
	lg, _ = newLogger(&pipe, "auto", "info", false)
	lg.Info().Dur("took", 4688293*time.Nanosecond).Msg("machine")
	var doc map[string]any
	if err := json.Unmarshal(pipe.Bytes(), &doc); err != nil {
		t.Fatalf("auto into a pipe: %q is not JSON: %v", pipe.String(), err)
	}
	if ts, _ := doc["time"].(string); !msTimestamp.MatchString(ts) || doc["took"] != "4.688293ms" {
		t.Fatalf("JSON log %s: want a millisecond timestamp and took=4.688293ms", pipe.String())
	}
	for _, bad := range [][2]string{{"xml", "info"}, {"auto", "loud"}, {"json", ""}} {
		if _, err := newLogger(&pipe, bad[0], bad[1], false); err == nil {
			t.Errorf("newLogger(%q, %q) accepted", bad[0], bad[1])
		}
	}
}
