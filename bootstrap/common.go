// Package bootstrap wires the edge and the node with fx. It is the only
// package besides cmd/ that imports fx; every constructor it uses is plain Go.
package bootstrap

import (
	"io"
	"log/slog"
	"os"

	"go.uber.org/fx"
	"go.uber.org/fx/fxevent"

	"iop/adapters/config"
)

// Version is the build's version, set with -ldflags "-X iop/bootstrap.Version=…".
var Version = "dev"

// NewLogger builds the process logger from its config, writing to w
// (stderr when nil).
func NewLogger(c config.LogConfig, w io.Writer) *slog.Logger {
	if w == nil {
		w = os.Stderr
	}
	opts := &slog.HandlerOptions{Level: c.SlogLevel()}
	if c.Format == config.LogJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// FxLogger routes fx's own events to log: wiring details at debug, start and
// stop failures at error, so a busy port is reported plainly.
func FxLogger(log *slog.Logger) fx.Option {
	return fx.WithLogger(func() fxevent.Logger {
		l := &fxevent.SlogLogger{Logger: log}
		l.UseLogLevel(slog.LevelDebug)
		l.UseErrorLevel(slog.LevelError)
		d := &fxevent.SlogLogger{Logger: log}
		d.UseLogLevel(slog.LevelDebug)
		d.UseErrorLevel(slog.LevelDebug)
		return quietStart{Logger: l, debug: d}
	})
}
