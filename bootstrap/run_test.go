package bootstrap_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/bootstrap"
)

// serveNode runs bootstrap.Serve on a node app whose logger writes at info
// level to the returned log, and returns its exit code and stderr. A node
// that starts is a test failure (Serve would wait for a signal).
func serveNode(t *testing.T, db string) (code int, stderr, log string) {
	t.Helper()
	var errBuf, logBuf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	app := fx.New(
		bootstrap.Node(bootstrap.NodeSettings{Edge: "127.0.0.1:1", Token: "x", DB: db, Logger: logger}),
		bootstrap.FxLogger(logger),
	)
	done := make(chan int, 1)
	go func() { done <- bootstrap.Serve("iop-node", app, logger, &errBuf) }()
	select {
	case code = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the node started")
	}
	return code, errBuf.String(), logBuf.String()
}

// A constructor's failure is one plain line naming the cause: not fx's
// "could not build arguments for function …" chain, and not logged again
// as ERROR lines with stack traces.
func TestStartFailureInAConstructorIsOnePlainLine(t *testing.T) {
	db := filepath.Join(t.TempDir(), "isdir.db")
	if err := os.Mkdir(db, 0o700); err != nil {
		t.Fatal(err)
	}
	code, stderr, log := serveNode(t, "file:"+db)
	want := fmt.Sprintf("iop-node: cannot start: open node store %q: cannot open database file %s: it is a directory\n", "file:"+db, db)
	if code != 1 || stderr != want {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 and:\n%s", code, stderr, want)
	}
	if log != "" {
		t.Fatalf("the failure was logged too:\n%s", log)
	}
}

// A node refuses a store another node uses, naming it and that node's pid,
// and one stopped releases the store for the next.
func TestSecondNodeOnOneStoreFailsStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n.db")
	db := "file:" + path + "?cache=shared&mode=rwc"
	first := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{Edge: "127.0.0.1:1", Token: "x", DB: db, Logger: quiet()}), fx.NopLogger)
	first.RequireStart()

	code, stderr, log := serveNode(t, db)
	want := fmt.Sprintf("iop-node: cannot start: another iop-node is using %s (pid %d)\n", path, os.Getpid())
	if code != 1 || stderr != want || log != "" {
		t.Fatalf("second node: exit %d, stderr:\n%s\nlog:\n%s\nwant exit 1 and:\n%s", code, stderr, log, want)
	}

	first.RequireStop()
	again := fxtest.New(t, bootstrap.Node(bootstrap.NodeSettings{Edge: "127.0.0.1:1", Token: "x", DB: db, Logger: quiet()}), fx.NopLogger)
	again.RequireStart()
	again.RequireStop()
}

// CatchHangup keeps SIGHUP from ending the process, and leaves it at its
// default in the children the process starts: an ignored signal stays
// ignored across exec, so every exec target and CLI agent a node ran
// survived a SIGHUP meant to end it.
func TestCatchHangupLeavesChildrenAlone(t *testing.T) {
	bootstrap.CatchHangup()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // still here: caught, not fatal
	out, err := exec.Command("sh", "-c", "kill -HUP $$; echo survived").Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || strings.Contains(string(out), "survived") {
		t.Fatalf("child: %q, %v; want it ended by its own SIGHUP", out, err)
	}
	if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGHUP {
		t.Fatalf("child ended %v, want by SIGHUP", exit)
	}
}
