package bootstrap

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"go.uber.org/fx"

	"iop/adapters/config"
	"iop/adapters/provider"
	"iop/adapters/runtime/factory"
	"iop/adapters/runtime/spawn"
	"iop/adapters/store/sqlite"
	"iop/adapters/transport"
	nodeapp "iop/application/node"
	"iop/domain"
	"iop/ports"
)

// NodeSettings is everything iop-node needs, after flags and the optional
// node config file are merged.
type NodeSettings struct {
	Edge       string
	Token      string
	DB         string
	Logger     *slog.Logger
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// Transport overrides link settings (tests use millisecond heartbeats;
	// the edge's heartbeat settings win once registered). Its TLS field
	// secures the link (NodeLinkTLS); nil is plaintext.
	Transport transport.Config
	// Builders adds runtime adapter types to the factory.
	Builders map[string]factory.Builder
	// StatsInterval is how often the node sends its stats to the edge
	// (transport.DefaultStatsInterval when zero).
	StatsInterval time.Duration
	// StoreRetention: finished runs that ended longer ago, and sessions
	// idle longer, are pruned from the store (node.yaml store.retention;
	// sqlite.DefaultRetention when zero, nothing pruned when negative).
	StoreRetention time.Duration
	// StorePruneInterval is how often the store is pruned after the pass
	// at start (sqlite.DefaultPruneInterval, an hour, when zero).
	StorePruneInterval time.Duration
}

// storeSizer returns the on-disk size of the SQLite database named by dsn
// (with its WAL), or nil for an in-memory one.
func storeSizer(dsn string) func() int64 {
	if dsn == "" {
		dsn = sqlite.DefaultDSN
	}
	// The file the store and its lock use (a "file:" URI's escapes and
	// host form understood), not a hand-cut prefix of the DSN.
	path := sqlite.ResolvedFilePath(dsn)
	if path == "" {
		return nil
	}
	return func() int64 {
		var n int64
		for _, p := range []string{path, path + "-wal"} {
			if fi, err := os.Stat(p); err == nil {
				n += fi.Size()
			}
		}
		return n
	}
}

// nodeHandlers joins the node's use cases into what the transport calls.
type nodeHandlers struct {
	*nodeapp.ApplyConfigHandler
	*nodeapp.RunManager
	*nodeapp.SessionHandler
	*nodeapp.CommandHandler
	*nodeapp.TunnelHandler
}

var _ transport.NodeHandler = nodeHandlers{}

// Node is the fx module of iop-node.
func Node(s NodeSettings) fx.Option {
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return fx.Module("node",
		fx.Supply(s),
		fx.Provide(
			func(s NodeSettings) *slog.Logger { return s.Logger },
			openNodeDB,
			fx.Annotate(sqlite.NewRunStore, fx.As(new(ports.RunStore))),
			sqlite.NewChatStore,
			sqlite.NewAgentSessionStore,
			newFactory,
			fx.Annotate(func(f *factory.Factory) *factory.Factory { return f }, fx.As(new(ports.AdapterFactory))),
			fx.Annotate(newProviderClient, fx.As(new(ports.ProviderClient))),
			func(f ports.AdapterFactory, log *slog.Logger) *nodeapp.Runtime {
				return nodeapp.NewRuntime(f, log).WithProviderCommands(providerCommands{})
			},
			nodeapp.NewRunManager,
			nodeapp.NewSessionHandler,
			func(rt *nodeapp.Runtime, log *slog.Logger, lat *nodeapp.ProviderLatencies) *nodeapp.ApplyConfigHandler {
				h := nodeapp.NewApplyConfigHandler(rt, log)
				h.Latencies = lat
				return h
			},
			func(rt *nodeapp.Runtime, rm *nodeapp.RunManager, sh *nodeapp.SessionHandler, st ports.RunStore) *nodeapp.CommandHandler {
				return nodeapp.NewCommandHandler(rt, rm, sh, st, Version)
			},
			nodeapp.NewProviderLatencies,
			func(rt *nodeapp.Runtime, c ports.ProviderClient, log *slog.Logger, lat *nodeapp.ProviderLatencies) *nodeapp.TunnelHandler {
				h := nodeapp.NewTunnelHandler(rt, c, log)
				h.Latencies = lat
				return h
			},
			func(s NodeSettings, rt *nodeapp.Runtime, lat *nodeapp.ProviderLatencies) *nodeapp.Stats {
				return nodeapp.NewStats(rt, lat, storeSizer(s.DB))
			},
			newNodeClient,
		),
		fx.Invoke(runNode),
	)
}

// newProviderClient is the node's provider client; its idle connections
// close when the node stops.
func newProviderClient(lc fx.Lifecycle) *provider.Client {
	c := provider.New(provider.Options{})
	lc.Append(fx.StopHook(c.Close))
	return c
}

// newFactory builds every runtime adapter type: exec, plus the LLM and CLI
// agent adapters with their session stores; s.Builders may add or replace.
func newFactory(s NodeSettings, chats *sqlite.ChatStore, agents *sqlite.AgentSessionStore) *factory.Factory {
	b := RuntimeBuilders(chats, agents)
	for t, f := range s.Builders {
		b[t] = f
	}
	return factory.New(b)
}

// openNodeDB locks the node's store and opens it. The lock comes first and
// is held until the store is closed: the store and the child-process record
// next to it describe one node's runs and children, and a second node on
// them would take the first one's for a crashed predecessor's, kill its
// children and fail its runs (Record, Recover).
func openNodeDB(lc fx.Lifecycle, s NodeSettings, log *slog.Logger) (*sqlite.DB, error) {
	dsn := s.DB
	if dsn == "" {
		dsn = sqlite.DefaultDSN
	}
	switch {
	case hasPrefixFold(dsn, "postgres://") || hasPrefixFold(dsn, "postgresql://"):
		// Not echoed: it holds a password. Any case: a URL's scheme is
		// case-insensitive, and SQLite would take POSTGRES://… for a
		// path and print it in its error.
		return nil, errors.New("--db: the node's store is an SQLite file (a path or a file: URI), not PostgreSQL")
	case sqlite.ReadOnly(dsn):
		// Every run would be served and none recorded (run_get, the
		// edge's repair after a restart, the recovery at start).
		return nil, fmt.Errorf("--db %s: the node's store cannot be read-only (mode=ro): it records every run", dsn)
	}
	lock, err := sqlite.LockFile(dsn)
	if err != nil {
		var held *sqlite.LockedError
		if errors.As(err, &held) {
			if held.PID > 0 {
				return nil, fmt.Errorf("another iop-node is using %s (pid %d)", held.Path, held.PID)
			}
			return nil, fmt.Errorf("another iop-node is using %s", held.Path)
		}
		return nil, err
	}
	// Appended before the store's close, so released after it.
	lc.Append(fx.StopHook(lock.Release))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := sqlite.Open(ctx, dsn)
	if err != nil {
		_ = lock.Release()
		return nil, fmt.Errorf("open node store %q: %w", dsn, err)
	}
	warnNarrowed(log, "node store", db.Narrowed())
	lc.Append(fx.StopHook(db.Close))
	// Appended after the close, so stopped before it.
	lc.Append(fx.StartStopHook(
		func() { db.StartPruning(s.StoreRetention, s.StorePruneInterval, log) },
		db.StopPruning,
	))
	return db, nil
}

func newNodeClient(s NodeSettings, log *slog.Logger, sd fx.Shutdowner, f *factory.Factory, ac *nodeapp.ApplyConfigHandler, rm *nodeapp.RunManager, sh *nodeapp.SessionHandler, ch *nodeapp.CommandHandler, th *nodeapp.TunnelHandler, st *nodeapp.Stats) *transport.Client {
	host, _ := os.Hostname()
	tc := s.Transport
	tc.Logger = log
	if tc.MaxFrameSize == 0 {
		// The node only writes small frames (events and bodies are chunked);
		// it reads whatever the edge is configured to send, up to the
		// largest max_frame_size an edge accepts.
		tc.MaxFrameSize = config.MaxMaxFrameSize
	}
	c := transport.NewClient(transport.ClientConfig{
		Addr: s.Edge, Token: s.Token, Transport: tc, MinBackoff: s.MinBackoff, MaxBackoff: s.MaxBackoff,
		Info:  domain.NodeInfo{Version: Version, Hostname: host, OS: runtime.GOOS, Arch: runtime.GOARCH, AdapterTypes: f.Types()},
		Stats: st.NodeStats, StatsInterval: s.StatsInterval,
		OnFatal: nodeRefused(log, s.Edge, rm.InFlight, sd),
	}, nodeHandlers{ac, rm, sh, ch, th})
	ch.SetTransport(c)
	return c
}

// nodeRefused is the client's OnFatal: it says at once why the edge will
// not have this node (its token, its client certificate, or an edge it
// cannot trust) and stops the node with exit code 1. The stop is the one
// SIGTERM makes (runNode's OnStop), runs in flight included, with its
// limits: the refusal is not held back until they end on their own, which
// for a background run could be hours.
func nodeRefused(log *slog.Logger, edge string, inFlight func() int, sd fx.Shutdowner) func(error) {
	return func(err error) {
		var rej *transport.RejectedError
		var trust *transport.TrustError
		var msg string
		attrs := []any{"edge", edge}
		switch {
		case errors.As(err, &trust):
			// Never retried: the next attempt could be the one a man in
			// the middle answers.
			msg = "stopping: " + err.Error()
		case errors.As(err, &rej) && strings.HasPrefix(rej.Reason, domain.CodeIdentityMismatch):
			msg = "the edge refused this node's client certificate: its CN or a DNS name must be the node id its token belongs to"
			attrs = append(attrs, "reason", rej.Reason)
		case errors.As(err, &rej):
			msg = "the edge refused this node's token; check --token (or $IOP_NODE_TOKEN) against edge.yaml nodes[]"
			attrs = append(attrs, "reason", rej.Reason)
		default:
			msg = "stopping: " + err.Error()
		}
		if n := inFlight(); n > 0 {
			runs := fmt.Sprintf("its %d runs in flight are", n)
			if n == 1 {
				runs = "its 1 run in flight is"
			}
			msg += "; exiting once " + runs + " stopped (as on SIGTERM)"
			attrs = append(attrs, "runs_in_flight", n)
		}
		log.Error(msg, attrs...)
		_ = sd.Shutdown(fx.ExitCode(1))
	}
}

// shutdownDrain bounds how long a stopping node waits for its runs to end
// and their last events to reach the link before it closes the link: long
// enough for an exec run's SIGTERM grace and output (exec.DefaultKillGrace
// plus its pipe grace), short of fx's stop timeout.
const shutdownDrain = 5 * time.Second

// shutdownTunnelDrain bounds, counted from the stop's start, how long a
// stopping node waits for the provider requests it relays to end before it
// closes the link, which cuts them: the edge sends it no new one once it
// drains, so a completion streaming at the stop can finish. It leaves the
// link's last writes (2 s) and the store's close their time within fx's
// 15 s.
const shutdownTunnelDrain = 10 * time.Second

// runNode owns the link goroutine: it starts after the store is open and
// unfinished runs are recovered, and stops before the store closes. A
// refused token shuts the process down with exit code 1.
func runNode(lc fx.Lifecycle, sd fx.Shutdowner, s NodeSettings, log *slog.Logger, c *transport.Client, rm *nodeapp.RunManager, rt *nodeapp.Runtime, th *nodeapp.TunnelHandler) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	lc.Append(fx.Hook{
		OnStart: func(start context.Context) error {
			if s.Token == "" {
				return errors.New("no token: pass --token, set $IOP_NODE_TOKEN, or set token/token_env in the node config")
			}
			// Children of an earlier node process that died without
			// stopping them (kill -9, OOM) are killed before any run starts.
			// Kept next to the file the store's lock covers (the link's
			// target, for a DSN that is a symlink): next to the link, a
			// node using another name of the same store would not see it.
			killed, err := spawn.Record(spawn.RecordFileFor(sqlite.ResolvedFilePath(cmp.Or(s.DB, sqlite.DefaultDSN))))
			if err != nil {
				return err
			}
			if killed > 0 {
				log.Warn("killed process groups an earlier node left running", "groups", killed)
			}
			if err := rm.Recover(start); err != nil {
				return err
			}
			go func() {
				defer close(done)
				// A refusal for good was reported, and the stop begun, by
				// the client's OnFatal (nodeRefused) the moment it came.
				_ = c.Run(ctx)
			}()
			retention := "none (everything is kept)"
			if r := cmp.Or(s.StoreRetention, sqlite.DefaultRetention); r > 0 {
				retention = r.String()
			}
			log.Info("iop-node started", "edge", s.Edge, "version", Version, "store_retention", retention)
			if s.Transport.TLS == nil && !config.IsLoopbackListen(s.Edge) {
				log.Warn("the link to the edge is plaintext (--insecure) and the edge is not on a loopback address: the node token and all run data cross the network in clear; "+
					"use --ca-pin (iop-edge --print-ca-pin) or --ca-file", "edge", s.Edge)
			}
			return nil
		},
		OnStop: func(stop context.Context) error {
			// Runs are stopped, and their terminal events (cancelled, "node
			// shutting down") handed to the link, before the link closes:
			// closed first, it would end their streams, so callers would get
			// node_disconnected and the edge would record the runs failed
			// while the node records them cancelled. BeginStop comes first
			// so that no run ending meanwhile reads as its caller leaving.
			// Before it, the edge is told the node drains: otherwise it
			// went on choosing this node for new runs all through the
			// drain (preferring it even, as its cancelled runs freed
			// slots), and each was refused with shutting_down.
			c.Drain()
			began := time.Now()
			rm.BeginStop()
			runsDone := make(chan struct{})
			go func() {
				rm.Stop()
				close(runsDone)
			}()
			// A run whose stream the edge has stopped reading (no credit)
			// cannot hand its event over: closing the link ends its wait.
			drain, cancelDrain := context.WithTimeout(stop, shutdownDrain)
			select {
			case <-runsDone:
			case <-drain.Done():
				log.Warn("runs still stopping; closing the link to the edge anyway", "after", shutdownDrain)
			}
			cancelDrain()
			waitTunnels(stop, th, began.Add(shutdownTunnelDrain), log)
			cancel() // closes the link once what is queued is written
			select {
			case <-runsDone:
			case <-stop.Done():
				spawn.KillAll()
				return stop.Err()
			}
			spawn.KillAll()
			select {
			case <-done:
			case <-stop.Done():
				return stop.Err()
			}
			rt.Close()
			return nil
		},
	})
}

// waitTunnels waits until the provider requests th relays have ended, or
// until by (or the stop's end), and says how many it then cuts.
func waitTunnels(stop context.Context, th *nodeapp.TunnelHandler, by time.Time, log *slog.Logger) {
	open, idle := th.Idle()
	if open == 0 {
		return
	}
	log.Info("waiting for the provider requests this node relays to end", "open", open, "at_most", time.Until(by).Round(time.Second))
	wait, cancel := context.WithDeadline(stop, by)
	defer cancel()
	select {
	case <-idle:
	case <-wait.Done():
		if open, _ = th.Idle(); open > 0 {
			log.Warn("provider requests still streaming; closing the link to the edge cuts them", "open", open, "after", shutdownTunnelDrain)
		}
	}
}

// hasPrefixFold is strings.HasPrefix ignoring case.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
