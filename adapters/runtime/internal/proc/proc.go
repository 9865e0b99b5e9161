// Package proc runs a CLI agent as a child process in a process group of its
// own, for the claude-code and codex runtime adapters: its stdout is read
// line by line by the caller, the last bytes of its stderr are kept for
// error messages, and stopping it signals the whole group, so that tools the
// agent spawned die with it. Arguments go to the program as argv; no shell
// is involved.
package proc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"iop/adapters/runtime/spawn"
)

// StderrTail is how many bytes of stderr a Process keeps.
const StderrTail = 4 << 10

// pipeGrace bounds how long Wait keeps reading stdout and stderr after the
// program exited, in case a descendant still holds them open.
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
}

// Process is a started program.
type Process struct {
	// Stdout is the program's standard output. It reaches EOF once the
	// program has exited and its output has been read.
	Stdout io.Reader

	cmd    *osexec.Cmd
	pr     *io.PipeReader
	pgid   int
	stderr *tail
	done   chan struct{} // closed when cmd.Wait has returned
	stop   chan struct{} // closed by Close to end the watcher
	once   sync.Once
}

// Start starts the program. When ctx is done, the process group gets
// SIGTERM, then SIGKILL after spec.KillGrace. The caller must read Stdout
// to its end (or call Kill) and then call Wait.
func Start(ctx context.Context, spec Spec) (*Process, error) {
	cmd := osexec.Command(spec.Path, spec.Args...)
	cmd.Dir = spec.Dir
	cmd.Env = spec.Env
	if spec.Stdin != nil {
		cmd.Stdin = bytes.NewReader(spec.Stdin)
	}
	pr, pw := io.Pipe()
	p := &Process{Stdout: pr, cmd: cmd, pr: pr, stderr: &tail{}, done: make(chan struct{}), stop: make(chan struct{})}
	cmd.Stdout = pw
	cmd.Stderr = p.stderr
	cmd.WaitDelay = pipeGrace
	group, err := spawn.Start(cmd)
	if err != nil {
		return nil, err
	}
	p.pgid = group.PGID()
	go func() {
		_ = cmd.Wait()
		// Whatever the program left running in its group goes with it.
		p.signal(syscall.SIGKILL)
		group.Release()
		pw.Close()
		close(p.done)
	}()
	go p.watch(ctx, spec.KillGrace)
	return p, nil
}

// PGID returns the process group id (the program's pid).
func (p *Process) PGID() int { return p.pgid }

func (p *Process) watch(ctx context.Context, grace time.Duration) {
	select {
	case <-p.done:
		return
	case <-p.stop:
		return
	case <-ctx.Done():
	}
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

func (p *Process) signal(sig syscall.Signal) {
	_ = syscall.Kill(-p.pgid, sig)
}

// Kill stops the program at once: SIGKILL to its group, stdout discarded.
// It waits for the program to be gone.
func (p *Process) Kill() {
	p.signal(syscall.SIGKILL)
	p.pr.CloseWithError(errors.New("proc: output abandoned"))
	p.Wait()
}

// Wait waits for the program to exit (after its stdout has been read or
// abandoned) and returns its state; nil if it could not be waited for.
func (p *Process) Wait() *os.ProcessState {
	<-p.done
	p.once.Do(func() { close(p.stop) })
	return p.cmd.ProcessState
}

// Stderr returns the last StderrTail bytes of stderr, trimmed. Call it after Wait.
func (p *Process) Stderr() string { return p.stderr.String() }

// tail keeps the last StderrTail bytes written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - StderrTail; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(strings.ToValidUTF8(string(t.buf), ""))
}
