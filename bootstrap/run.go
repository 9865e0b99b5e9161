package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/dig"
	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"iop/adapters/runtime/spawn"
)

// Serve starts app, waits for a signal or a shutdown and stops it, like
// fx's Run, but a failure to start is one plain line on stderr ("iop-edge:
// cannot start: 127.0.0.1:7701 is already in use") instead of fx's own
// lines. It returns the process's exit code.
//
// The first SIGINT or SIGTERM stops the process gracefully (0). Another
// one while it stops (the operator's second Ctrl-C, a supervisor's second
// SIGTERM) ends it at once, after one line at warn, with 128 plus the
// signal's number (130 for SIGINT, 143 for SIGTERM), what a shell reports
// for a process that signal killed: the stop was cut short, not clean. fx
// swallowed that second signal, so the process went on waiting for its
// runs and tunnels, up to its whole stop time.
// The caller has called CatchHangup before building app.
func Serve(name string, app *fx.App, log *slog.Logger, stderr io.Writer) int {
	startCtx, cancel := context.WithTimeout(context.Background(), app.StartTimeout())
	err := app.Start(startCtx)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "%s: cannot start: %s\n", name, startProblem(err))
		return 1
	}
	// Registered before fx's own channel (app.Wait), so every signal fx
	// sees reaches it too, and buffered beyond two so that a second signal
	// arriving with the first is kept.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	var sig fx.ShutdownSignal
	bySignal := true
	select {
	case sig = <-app.Wait():
		// fx reports a signal with exit code 0, and a Shutdown (the node
		// refused by its edge, or not trusting it) with the code it was
		// given, never 0 here. A signal fx saw is on sigs too (or about to
		// be: both get it in one delivery); a Shutdown is not.
		if sig.ExitCode != 0 {
			bySignal = false
		} else {
			select {
			case <-sigs:
			case <-time.After(time.Second):
				bySignal = false
			}
		}
	case s := <-sigs:
		sig = fx.ShutdownSignal{Signal: s}
	}
	if bySignal {
		log.Info("stopping gracefully; a second SIGINT or SIGTERM stops at once", "signal", sig.Signal.String())
	}
	stopped := make(chan struct{})
	defer close(stopped)
	go forceOnSignal(sigs, stopped, bySignal, log)

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

// forceOnSignal ends the process on a signal that arrives before stopped
// is closed: it kills the process groups of the runs still going (as the
// node's stop would have), giving that a second at most, and exits with
// 128 plus the signal's number.
func forceOnSignal(sigs <-chan os.Signal, stopped <-chan struct{}, second bool, log *slog.Logger) {
	var s os.Signal
	select {
	case s = <-sigs:
	case <-stopped:
		return
	}
	code := 1
	if n, ok := s.(syscall.Signal); ok {
		code = 128 + int(n)
	}
	msg := "signal while stopping: stopping now without waiting for the graceful stop to finish"
	if second {
		msg = "second signal: stopping now without waiting for the graceful stop to finish"
	}
	log.Warn(msg, "signal", s.String(), "exit_code", code)
	killed := make(chan struct{})
	go func() {
		spawn.KillAll()
		close(killed)
	}()
	select {
	case <-killed:
	case <-time.After(time.Second):
	}
	os.Exit(code)
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

var brokenPipeOnce sync.Once

// CatchBrokenPipe makes a log line written to a stdout or stderr whose
// reader has gone (the ssh session a node was started from dropped, a
// `| tee` or log shipper that exited) fail with EPIPE, lost, instead of
// killing the process with SIGPIPE, as Go does for fds 1 and 2: the
// process died at its next log line, without a drain, its runs not ended.
// Caught, not ignored, for the reason CatchHangup gives: a run's children
// keep SIGPIPE's default. Call it first thing in main.
func CatchBrokenPipe() {
	brokenPipeOnce.Do(func() {
		// Never read: signal delivery does not block on a full channel.
		signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	})
}
