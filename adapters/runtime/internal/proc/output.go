package proc

import (
	"errors"
	"io"
	"os"
	"sync/atomic"
	"time"
)

// Output is a child's stdout as its parent reads it: the read end of a pipe
// whose write end the child, and whatever it starts, holds.
//
// The parent reads at its own pace. os/exec, given a Writer, copies a
// child's output from a goroutine of its own and, with Cmd.WaitDelay set,
// closes the pipe that long after the child exits, whatever is still unread:
// a reader held back by a slow caller lost the end of the output (an agent's
// result line, a command's last lines), with the run still reported as a
// success. Here nothing is closed on a timer while output is waiting.
//
// Once Exited is called (the child is gone and its group killed), a read
// that waits pipeGrace with nothing arriving ends the output: a descendant
// that left the group may still hold the write end, and its output is not
// waited for past that.
type Output struct {
	f      *os.File
	exited atomic.Bool
}

// NewOutput makes the pipe. The caller gives w to the child (Cmd.Stdout) and
// closes it once the child is started, or failed to start.
func NewOutput() (out *Output, w *os.File, err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	return &Output{f: r}, w, nil
}

// Read reads the output; io.EOF once every writer is gone, or once nothing
// arrived for pipeGrace after Exited.
func (o *Output) Read(p []byte) (int, error) {
	if o.exited.Load() {
		// Renewed before every read: the limit is on waiting for new
		// output, never on how long the reader took between reads.
		_ = o.f.SetReadDeadline(time.Now().Add(pipeGrace))
	}
	n, err := o.f.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return n, io.EOF
	}
	return n, err
}

// Exited starts the idle bound. Safe to call while a Read is waiting.
func (o *Output) Exited() {
	o.exited.Store(true)
	_ = o.f.SetReadDeadline(time.Now().Add(pipeGrace))
}

// Close closes the read end: a waiting Read returns, and a writer still
// holding the pipe gets EPIPE. Safe to call more than once and during a Read.
func (o *Output) Close() error { return o.f.Close() }
