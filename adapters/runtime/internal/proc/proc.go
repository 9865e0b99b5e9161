// Package proc runs a CLI agent as a child process in a session and process
// group of its own (no controlling terminal), for the CLI agent runtime
// adapters: its stdout is read line by line
// by the caller, the last bytes of its stderr are kept for error messages
// (and its lines handed, as they come, to a callback that asks for them),
// and stopping it signals the whole group and the groups and sessions its
// tools run in (spawn.Group.Signal), and once it has exited whatever it left
// running is killed (spawn.Group.Wait), so that the tools the agent spawned
// die with it. Arguments go to the program as argv; no shell is involved.
package proc

import (
	"bytes"
	"context"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"iop/adapters/runtime/internal/lines"
	"iop/adapters/runtime/spawn"
)

// StderrTail is how many bytes of stderr a Process keeps.
const StderrTail = 4 << 10

// MaxStderrLine is the most of one stderr line Spec.StderrLine is given:
// the rest of a longer line is dropped.
const MaxStderrLine = 4 << 10

// pipeGrace bounds how long the output is waited for once the program has
// exited, in case a descendant outside its group still holds stdout or
// stderr open: for stderr, Cmd.WaitDelay; for stdout (Output), the longest
// wait for new bytes, however long the reader takes to read what is there.
const pipeGrace = time.Second

// Spec describes the program to run.
type Spec struct {
	Path  string
	Args  []string // after the program name
	Dir   string   // "" is the node's working directory
	Env   []string // nil is the node's environment
	Stdin []byte   // written to stdin, which is then closed; nil is /dev/null
	// KillGrace is the delay between SIGTERM and SIGKILL when ctx is
	// cancelled; zero or negative kills at once.
	KillGrace time.Duration
	// StderrLine, if set, is called with each line of stderr as it comes,
	// in order, without its line ending and cut to MaxStderrLine bytes (a
	// last line without one once stderr ends). It runs on the goroutine
	// that copies stderr, so it must not block, and it must not keep line.
	// It may still be called after Wait has returned, when a descendant
	// outside the group holds stderr open.
	StderrLine func(line []byte)
}

// Process is a started program.
type Process struct {
	// Stdout is the program's standard output. It reaches EOF once the
	// program has exited and its output has been read.
	Stdout io.Reader

	cmd     *osexec.Cmd
	out     *Output
	group   *spawn.Group
	stopped atomic.Bool // the watcher signalled the group before it exited
	stderr  *tail
	done    chan struct{} // closed when cmd.Wait has returned
	stop    chan struct{} // closed by Close to end the watcher
	once    sync.Once
}

// Start starts the program. When ctx is done, the process group (and every
// process the program started, see spawn.Group.Signal) gets SIGTERM, then
// SIGKILL after spec.KillGrace. The caller must read Stdout
// to its end (or call Kill) and then call Wait.
func Start(ctx context.Context, spec Spec) (*Process, error) {
	cmd := osexec.Command(spec.Path, spec.Args...)
	if path, ok := envPATH(spec.Env); ok && !strings.ContainsRune(spec.Path, filepath.Separator) {
		// Found where the child would look: osexec.Command searched the
		// node's PATH, and an agent whose env declares its own ran the
		// node's copy of the command, or none.
		cmd.Path, cmd.Err = LookPathIn(spec.Path, path)
	}
	cmd.Dir = spec.Dir
	cmd.Env = spec.Env
	if spec.Stdin != nil {
		cmd.Stdin = bytes.NewReader(spec.Stdin)
	}
	out, w, err := NewOutput()
	if err != nil {
		return nil, err
	}
	p := &Process{Stdout: out, cmd: cmd, out: out, stderr: &tail{line: spec.StderrLine}, done: make(chan struct{}), stop: make(chan struct{})}
	// The child writes stdout straight into the pipe (os/exec copies
	// nothing for an *os.File), so its output waits there for the reader
	// however slow; WaitDelay bounds only the stderr copy, which never
	// blocks.
	cmd.Stdout = w
	cmd.Stderr = p.stderr
	cmd.WaitDelay = pipeGrace
	group, err := spawn.Start(cmd)
	_ = w.Close() // the child has its copy, or never will
	if err != nil {
		_ = out.Close()
		return nil, err
	}
	p.group = group
	go func() {
		// Whatever the program left running goes with it.
		_ = group.Wait()
		p.stderr.flush()
		group.Release()
		out.Exited()
		close(p.done)
	}()
	go p.watch(ctx, spec.KillGrace)
	return p, nil
}

// PGID returns the process group id (the program's pid).
func (p *Process) PGID() int { return p.group.PGID() }

// watch stops the program when ctx ends before it exits. That it exited
// is the group's word, not p.done: Wait closes done only once what the
// program left is killed and its output read, which may take seconds, and
// a program that exited on its own meanwhile was not stopped.
func (p *Process) watch(ctx context.Context, grace time.Duration) {
	exited := p.group.Exited()
	select {
	case <-exited:
		return
	case <-p.stop:
		return
	case <-ctx.Done():
	}
	select {
	case <-exited:
		return // it exited on its own as ctx ended
	default:
	}
	p.stopped.Store(true)
	if grace > 0 {
		p.signal(syscall.SIGTERM)
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-p.done:
			return
		case <-timer.C:
		}
	}
	p.signal(syscall.SIGKILL)
}

func (p *Process) signal(sig syscall.Signal) { p.group.Signal(sig) }

// Stopped reports whether the program was signalled because ctx ended
// before it exited: false for a program that exited on its own, however
// long its output then took to read. Call it after Wait.
func (p *Process) Stopped() bool { return p.stopped.Load() }

// Kill stops the program at once: SIGKILL to its group and everything it
// started, stdout discarded.
// It waits for the program to be gone.
func (p *Process) Kill() {
	p.signal(syscall.SIGKILL)
	_ = p.out.Close()
	p.Wait()
}

// Wait waits for the program to exit (after its stdout has been read or
// abandoned) and returns its state; nil if it could not be waited for.
func (p *Process) Wait() *os.ProcessState {
	<-p.done
	p.once.Do(func() {
		close(p.stop)
		_ = p.out.Close()
	})
	return p.cmd.ProcessState
}

// Done is closed once the program has exited and its stderr has been read
// to its end (every StderrLine delivered); Wait then returns at once.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stderr returns the last StderrTail bytes of stderr, trimmed. Call it after Wait.
func (p *Process) Stderr() string { return p.stderr.String() }

// tail keeps the last StderrTail bytes written to it, and hands each line
// to line, if set.
type tail struct {
	mu   sync.Mutex
	buf  []byte
	line func([]byte)
	cur  []byte // the line being written, at most MaxStderrLine bytes
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - StderrTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	if t.line != nil {
		t.split(b)
	}
	return len(b), nil
}

// split hands the complete lines in b, after what came before, to t.line.
func (t *tail) split(b []byte) {
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		piece := b
		if i >= 0 {
			piece = b[:i]
		}
		if room := MaxStderrLine - len(t.cur); len(piece) > room {
			piece = piece[:room] // the rest of the line is dropped
		}
		t.cur = append(t.cur, piece...)
		if i < 0 {
			return
		}
		t.emit()
		b = b[i+1:]
	}
}

func (t *tail) emit() {
	t.line(bytes.TrimSuffix(t.cur, []byte("\r")))
	t.cur = t.cur[:0]
}

// flush hands a last line without a line ending to t.line.
func (t *tail) flush() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.line != nil && len(t.cur) > 0 {
		t.emit()
	}
}

// String is the tail with surrounding space trimmed: a rune the tail
// starts inside of is dropped, other bytes that are not UTF-8 become
// U+FFFD.
func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(lines.ValidText(t.buf))
}
