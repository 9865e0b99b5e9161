package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.uber.org/dig"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"
)

// Serve starts app, waits for a signal or a shutdown and stops it, like
// fx's Run, but a failure to start is one plain line on stderr ("iop-edge:
// cannot start: 127.0.0.1:7701 is already in use") instead of fx's own
// lines. It returns the process's exit code.
// The caller has called CatchHangup before building app.
func Serve(name string, app *fx.App, stderr io.Writer) int {
	startCtx, cancel := context.WithTimeout(context.Background(), app.StartTimeout())
	err := app.Start(startCtx)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "%s: cannot start: %s\n", name, startProblem(err))
		return 1
	}
	sig := <-app.Wait()
	stopCtx, cancel := context.WithTimeout(context.Background(), app.StopTimeout())
	defer cancel()
	if err := app.Stop(stopCtx); err != nil {
		fmt.Fprintf(stderr, "%s: stopping: %v\n", name, err)
		if sig.ExitCode == 0 {
			return 1
		}
	}
	return sig.ExitCode
}

// startProblem words a start failure plainly: a busy address as such, and a
// constructor's error without the chain of fx and dig wrappers around it
// ("could not build arguments for function … failed to build …"), which
// names Go functions, not the problem.
func startProblem(err error) string {
	var op *net.OpError
	if errors.Is(err, syscall.EADDRINUSE) && errors.As(err, &op) && op.Addr != nil {
		return fmt.Sprintf("%s is already in use by another process (is another instance running? change the listen address in the config)", op.Addr)
	}
	return dig.RootCause(err).Error()
}

// quietStart passes fx's events to its logger, except the start failures
// that Serve reports itself (a constructor's or invoke's error, a start
// hook's), which go to debug.
type quietStart struct {
	fxevent.Logger
	debug fxevent.Logger
}

func (q quietStart) LogEvent(e fxevent.Event) {
	switch ev := e.(type) {
	case *fxevent.Run:
		if ev.Err != nil {
			q.debug.LogEvent(e)
			return
		}
	case *fxevent.Invoked:
		if ev.Err != nil {
			q.debug.LogEvent(e)
			return
		}
	case *fxevent.OnStartExecuted:
		if ev.Err != nil {
			q.debug.LogEvent(e)
			return
		}
	case *fxevent.RollingBack:
		q.debug.LogEvent(e)
		return
	case *fxevent.Started:
		if ev.Err != nil {
			q.debug.LogEvent(e)
			return
		}
	}
	q.Logger.LogEvent(e)
}

var hangupOnce sync.Once

// CatchHangup makes SIGHUP end neither binary (its default): a hangup of
// the terminal a process was started from, or a reload sent to an edge
// still starting or already stopping, would otherwise kill it without a
// drain. The edge takes SIGHUP over while it runs, to reload (runEdge);
// otherwise it is caught and dropped. Caught, not ignored: an ignored
// signal stays ignored across exec, so every child a run starts would
// ignore SIGHUP too. Call it first thing in main.
func CatchHangup() {
	hangupOnce.Do(func() {
		// Never read: signal delivery does not block on a full channel.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
	})
}
