package exec

import (
	"os"
	"syscall"
)

// prefilledStdin returns the read end of a pipe that already holds input,
// its write end closed, or nil when input is larger than pipeAtomic. Given
// an *os.File as stdin, os/exec passes it to the child as it is: no pipe of
// its own registered with the poller, no goroutine copying the input. The
// pipe is blocking, so the runtime's poller does not take it either; the
// write cannot block, because a new pipe holds at least one page (PIPE_BUF,
// even when the user's pipe quota is used up) and nobody else writes to it.
// The caller closes the file once the child has started.
func prefilledStdin(input []byte) (*os.File, error) {
	if len(input) > pipeAtomic {
		return nil, nil
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return nil, err
	}
	for len(input) > 0 {
		n, err := syscall.Write(p[1], input)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			_ = syscall.Close(p[0])
			_ = syscall.Close(p[1])
			return nil, err
		}
		input = input[n:]
	}
	if err := syscall.Close(p[1]); err != nil {
		_ = syscall.Close(p[0])
		return nil, err
	}
	return os.NewFile(uintptr(p[0]), "|0"), nil
}

// pipeAtomic is PIPE_BUF on Linux: a pipe's smallest capacity.
const pipeAtomic = 4096
