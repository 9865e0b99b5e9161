//go:build linux

package main

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"iop/adapters/config"
)

// openPTY returns a pseudo-terminal's two ends: what a terminal emulator
// holds (master) and what a program run in it reads and writes (tty).
func openPTY(t *testing.T) (master, tty *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); s.Close() })
	return m, s
}

// iop-edge hash-token run in a terminal reads the token with echo off: what
// the operator types does not appear on the screen (nor in its
// scrollback), and the terminal echoes again afterwards.
func TestHashTokenFromATerminalIsNotEchoed(t *testing.T) {
	master, tty := openPTY(t)
	var mu sync.Mutex
	var screen bytes.Buffer
	ended := make(chan struct{})
	go func() { // the terminal's screen: everything the pty shows
		defer close(ended)
		b := make([]byte, 1024)
		for {
			n, err := master.Read(b)
			mu.Lock()
			screen.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	shown := func() string { mu.Lock(); defer mu.Unlock(); return screen.String() }
	var out bytes.Buffer
	done := make(chan error, 1)
	// The hash goes to the terminal too, as when stdout is not redirected.
	go func() { done <- hashToken(tty, io.MultiWriter(&out, tty), tty, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(shown(), "token (not shown): ") {
		if time.Now().After(deadline) {
			t.Fatalf("no prompt on the terminal; it shows %q", shown())
		}
		time.Sleep(5 * time.Millisecond)
	}
	const token = "s3cret-token-typed-in"
	if _, err := master.Write([]byte(token + "\n")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := strings.TrimSpace(out.String()), config.TokenHash(token); got != want {
		t.Fatalf("printed %q, want %q", got, want)
	}
	tio, err := unix.IoctlGetTermios(int(tty.Fd()), unix.TCGETS)
	if err != nil {
		t.Fatal(err)
	}
	if tio.Lflag&unix.ECHO == 0 {
		t.Fatal("the terminal's echo was left off")
	}
	tty.Close() // the screen reader then reads what is left and ends
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the terminal's screen never ended")
	}
	if strings.Contains(shown(), token) {
		t.Fatalf("the token was echoed: the terminal shows %q", shown())
	}
	// The Enter typed is not echoed either: the prompt's line is ended
	// before the hash, which used to stand on it.
	if want := "token (not shown): \r\n" + config.TokenHash(token) + "\r\n"; !strings.Contains(shown(), want) {
		t.Fatalf("the terminal shows %q; want the hash on a line of its own (%q)", shown(), want)
	}
}
