package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"iop/adapters/config"
	httpapi "iop/adapters/http"
)

// CheckPprofAddr accepts only loopback addresses: the profiler exposes
// heap contents and must never be reachable from the network.
func CheckPprofAddr(addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("--pprof %q: %w", addr, err)
	}
	if config.IsLoopbackListen(addr) {
		return nil
	}
	return fmt.Errorf("--pprof %q: only a loopback address (127.0.0.1, ::1, localhost) is allowed", addr)
}

// StartPprof serves net/http/pprof on addr (loopback only) until the
// returned stop is called.
func StartPprof(addr string, log *slog.Logger) (stop func(), err error) {
	if err := CheckPprofAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof: %w", err)
	}
	mux := http.NewServeMux()
	// No /debug/pprof/cmdline: the argv may hold a node's --token (Index
	// answers 404 for it).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// Loopback alone does not keep a web page out: one that re-points its
	// own name at 127.0.0.1 (DNS rebinding) could read the profiles.
	srv := &http.Server{Handler: httpapi.LoopbackHostsOnly("--pprof", mux), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof listener stopped", "err", err)
		}
	}()
	log.Info("pprof listening", "addr", ln.Addr().String())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
