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
// Once Exited is called (the child is gone and its group killed), the
// reads may wait for new bytes pipeGrace in all, then the output ends: a
// descendant that left the group may still hold the write end, and it is
// not waited for past that, however it trickles. Bytes already in the pipe
// cost no waiting, so they are all read whatever the reader's pace.
type Output struct {
	f      *os.File
	exited atomic.Bool
	waited time.Duration // blocked in reads since Exited; the reader's own
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

// Read reads the output; io.EOF once every writer is gone, or once the
// reads since Exited have waited pipeGrace in all. One goroutine reads.
func (o *Output) Read(p []byte) (int, error) {
	var n int
	var err error
	if !o.exited.Load() {
		n, err = o.f.Read(p) // a deadline here is Exited's
	} else {
		left := pipeGrace - o.waited
		if left <= 0 {
			return 0, io.EOF
		}
		_ = o.f.SetReadDeadline(time.Now().Add(left))
		start := time.Now()
		n, err = o.f.Read(p)
		o.waited += time.Since(start)
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		return n, io.EOF
	}
	return n, err
}

// Exited starts the bound on waiting. Safe to call while a Read is
// waiting (that read then waits pipeGrace at most).
func (o *Output) Exited() {
	o.exited.Store(true)
	_ = o.f.SetReadDeadline(time.Now().Add(pipeGrace))
}

// Close closes the read end: a waiting Read returns, and a writer still
// holding the pipe gets EPIPE. Safe to call more than once and during a Read.
func (o *Output) Close() error { return o.f.Close() }
