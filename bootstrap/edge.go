package bootstrap

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"go.uber.org/fx"

	"iop/adapters/config"
	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/adapters/http/console"
	openaiapi "iop/adapters/http/openai"
	"iop/adapters/metrics/prom"
	"iop/adapters/provider/models"
	"iop/adapters/store/edgestore"
	"iop/adapters/tlsca"
	"iop/adapters/transport"
	edgeapp "iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// EdgeSettings is everything iop-edge needs.
type EdgeSettings struct {
	Config     *config.EdgeConfig
	ConfigPath string // re-read on SIGHUP and POST /v1/admin/reload; "" disables reload
	Logger     *slog.Logger
}

// fileSource re-reads edge.yaml for reloads; an invalid file is rejected
// whole. Its settings outside nodes[] are compared with those the edge
// started with (running), which a reload does not change.
type fileSource struct {
	path    string
	running *config.EdgeConfig
}

func (f fileSource) LoadNodes() ([]domain.NodeRecord, []string, error) {
	cfg, err := config.LoadEdgeReload(f.path)
	if err != nil {
		return nil, nil, err
	}
	// LoadEdgeReload checked the file's transport.listen; a changed listen
	// address takes a restart, so the nodes of this file would register on
	// the one the edge listens on.
	if err := cfg.CheckSampleTokens(f.running.Transport.Listen); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", f.path, err)
	}
	return cfg.Records(), f.running.RestartKeys(cfg), nil
}

// Edge is the fx module of iop-edge.
func Edge(s EdgeSettings) fx.Option {
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return fx.Module("edge",
		fx.Supply(s),
		fx.Provide(
			func(s EdgeSettings) *slog.Logger { return s.Logger },
			func(s EdgeSettings) *config.Directory { return config.NewDirectory(s.Config.Records()) },
			fx.Annotate(func(d *config.Directory) *config.Directory { return d }, fx.As(new(ports.NodeDirectory))),
			fx.Annotate(func(d *config.Directory) *config.Directory { return d }, fx.As(new(edgeapp.Directory))),
			fx.Annotate(func(s EdgeSettings) fileSource {
				return fileSource{path: s.ConfigPath, running: s.Config}
			}, fx.As(new(ports.NodeSource))),
			func() *eventbus.Bus { return eventbus.New() },
			fx.Annotate(func(b *eventbus.Bus) *eventbus.Bus { return b }, fx.As(new(ports.EventPublisher))),
			edgeapp.NewRegistry,
			func() *edgeapp.RunTracker { return edgeapp.NewRunTracker(0) },
			func() *edgeapp.ConfigVersions { return &edgeapp.ConfigVersions{} },
			newEdgeMetrics,
			newEdgeStore,
			newStateDir,
			newMetricsServer,
			func(m *prom.Metrics, st *edgestore.Store) edgeapp.Observers {
				return edgeapp.Observers{Metrics: m, History: st}
			},
			func(st *edgestore.Store, nodes *edgeapp.GetRunHandler) *edgeapp.RunHistoryHandler {
				h := edgeapp.NewRunHistoryHandler(st)
				h.Nodes, h.Record = nodes, st
				return h
			},
			edgeapp.NewOrphanCancels,
			// The register handler owns the reconciler (its Close stops
			// it); the submit handler tells it of runs it lets go of.
			edgeapp.NewHistoryReconciler,
			func(s EdgeSettings, dir ports.NodeDirectory, reg *edgeapp.Registry, bus ports.EventPublisher, v *edgeapp.ConfigVersions, log *slog.Logger, m *prom.Metrics, rc *edgeapp.HistoryReconciler, orphans *edgeapp.OrphanCancels) *edgeapp.RegisterHandler {
				h := edgeapp.NewRegisterHandler(dir, reg, bus, v, log)
				h.Metrics = m
				h.Reconcile = rc
				h.Orphans = orphans
				return h
			},
			func(s EdgeSettings, reg *edgeapp.Registry, runs *edgeapp.RunTracker, bus ports.EventPublisher, log *slog.Logger, obs edgeapp.Observers, orphans *edgeapp.OrphanCancels, st *edgestore.Store, rc *edgeapp.HistoryReconciler) *edgeapp.SubmitRunHandler {
				h := edgeapp.NewSubmitRunHandler(reg, runs, bus, log)
				h.Orphans = orphans
				h.Reconcile = rc
				h.Sessions = st
				h.AdminKey = adminKeys(s.Config.HTTP)
				// A run request travels in one frame on the node link.
				h.MaxRequestBytes = int(s.Config.Transport.MaxFrameSize)
				h.Observe = obs
				return h
			},
			func(reg *edgeapp.Registry, runs *edgeapp.RunTracker, st *edgestore.Store, rc *edgeapp.HistoryReconciler) *edgeapp.CancelRunHandler {
				h := edgeapp.NewCancelRunHandler(reg, runs)
				h.History, h.Record, h.Reconcile = st, st, rc
				h.Edge = sharedEdgeID(st)
				return h
			},
			func(s EdgeSettings, reg *edgeapp.Registry, st *edgestore.Store, log *slog.Logger) *edgeapp.TerminateSessionHandler {
				h := edgeapp.NewTerminateSessionHandler(reg)
				h.Sessions, h.Log = st, log
				h.AdminKey = adminKeys(s.Config.HTTP)
				h.Edge = sharedEdgeID(st)
				return h
			},
			func(s EdgeSettings, reg *edgeapp.Registry, ledger *edgeapp.UsageLedger) *edgeapp.NodeCommandHandler {
				h := edgeapp.NewNodeCommandHandler(reg)
				h.MaxRequestBytes = int(s.Config.Transport.MaxFrameSize)
				h.Ledger = ledger
				return h
			},
			edgeapp.NewGetRunHandler,
			edgeapp.NewListRunsHandler,
			edgeapp.NewListNodesHandler,
			func(s EdgeSettings, src ports.NodeSource, dir edgeapp.Directory, reg *edgeapp.Registry, bus ports.EventPublisher, v *edgeapp.ConfigVersions, log *slog.Logger, rc *edgeapp.HistoryReconciler) *edgeapp.ReloadHandler {
				h := edgeapp.NewReloadHandler(src, dir, reg, bus, v, log)
				h.Reconcile = rc
				// The running keys stay (api_keys take a restart): one
				// limited to a node the reload renames or removes reaches
				// that node no more. Said once the reload is accepted, for
				// SIGHUP and POST /v1/admin/reload alike: a refused one
				// leaves the nodes listed as they were.
				h.Accepted = func(recs []domain.NodeRecord) {
					ids := make([]string, len(recs))
					for i, r := range recs {
						ids[i] = r.ID
					}
					warnUnknownKeyNodes(log, s.Config.HTTP.APIKeys, ids)
				}
				return h
			},
			func() ports.ModelLister { return models.Lists{} },
			edgeapp.NewModelCatalog,
			edgeapp.NewUsageLedger,
			func(reg *edgeapp.Registry, bus ports.EventPublisher, c *edgeapp.ModelCatalog, l *edgeapp.UsageLedger, log *slog.Logger, obs edgeapp.Observers, st *edgestore.Store, dir edgeapp.Directory) *edgeapp.SubmitProviderTunnelHandler {
				h := edgeapp.NewSubmitProviderTunnelHandler(reg, bus, c, l, log)
				h.Observe = obs
				h.Responses = st
				h.Nodes = dir
				return h
			},
			func(s EdgeSettings, t *edgeapp.SubmitProviderTunnelHandler, c *edgeapp.ModelCatalog, log *slog.Logger) *openaiapi.Handler {
				h := openaiapi.New(openaiapi.Deps{Tunnels: t, Models: c}, log)
				if s.Config.HTTP.MaxBodyBytes > 0 {
					h.MaxBody = s.Config.HTTP.MaxBodyBytes
				}
				return h
			},
			newLinkTLS,
			newTransportServer,
			newHTTPServer,
		),
		fx.Invoke(runEdge),
	)
}

func transportConfig(c config.TransportConfig, log *slog.Logger) transport.Config {
	return transport.Config{
		HeartbeatInterval: c.HeartbeatInterval.Std(),
		HeartbeatTimeout:  c.HeartbeatTimeout.Std(),
		MaxFrameSize:      int(c.MaxFrameSize),
		Logger:            log,
	}
}

func newTransportServer(s EdgeSettings, log *slog.Logger, reg *edgeapp.RegisterHandler, lt *LinkTLS) *transport.Server {
	tc := transportConfig(s.Config.Transport, log)
	tc.TLS = lt.Config
	// The transport hands the register use case what TLS verified; whether
	// a client certificate must name the node is the use case's rule.
	reg.BindIdentity = s.Config.Transport.TLS.BindNodeIdentity
	return transport.NewServer(s.Config.Transport.Listen, tc, reg)
}

func newHTTPServer(lc fx.Lifecycle, s EdgeSettings, log *slog.Logger, bus *eventbus.Bus, reg *edgeapp.Registry, submit *edgeapp.SubmitRunHandler,
	cancel *edgeapp.CancelRunHandler, term *edgeapp.TerminateSessionHandler, cmds *edgeapp.NodeCommandHandler,
	get *edgeapp.GetRunHandler, list *edgeapp.ListRunsHandler, reload *edgeapp.ReloadHandler,
	oa *openaiapi.Handler, ledger *edgeapp.UsageLedger, history *edgeapp.RunHistoryHandler, m *prom.Metrics, nodes *edgeapp.ListNodesHandler) (*httpapi.Server, error) {
	deps := httpapi.Deps{
		Registry: reg, Nodes: nodes, Submit: submit, Cancel: cancel, Terminate: term, Commands: cmds,
		GetRun: get, ListRuns: list, Events: bus, OpenAI: oa,
		TunnelUsage: ledger.ForNode, History: history, Metrics: m.Handler(),
	}
	if s.ConfigPath != "" {
		deps.Reload = reload.Handle
	}
	hc := s.Config.HTTP
	for _, k := range hc.ResolvedKeys() {
		deps.APIKeys = append(deps.APIKeys, httpapi.APIKey{SHA256: k.SHA256, Principal: k.Principal})
	}
	warnUnknownKeyNodes(log, s.Config.HTTP.APIKeys, nodeIDs(s.Config.Nodes))
	if len(deps.APIKeys) == 0 && hc.AllowUnauthenticated {
		log.Warn("http api has no api_keys and http.allow_unauthenticated is set: anyone who reaches it may run work on every node, read every run and reload the config",
			"listen", hc.Listen)
	}
	if len(deps.APIKeys) > 0 && hc.TLS == nil && !config.IsLoopbackListen(hc.Listen) {
		log.Warn("http.listen is not a loopback address and http.tls is not set: API keys and all run data cross the network in clear; "+
			"set http.tls (cert_file, key_file) or serve the API behind a TLS-terminating proxy on loopback",
			"listen", hc.Listen)
	}
	if hc.TLS != nil {
		cert, err := tls.LoadX509KeyPair(hc.TLS.CertFile, hc.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("http.tls: load certificate %s and key %s: %w", hc.TLS.CertFile, hc.TLS.KeyFile, err)
		}
		deps.TLSCert = &cert
		exp, err := tlsca.APIKeyPairExpiry(&cert, hc.TLS.CertFile)
		if err != nil {
			return nil, fmt.Errorf("http.tls: %w", err)
		}
		// Warned about ahead of its end, at start and every renewCheckEvery;
		// an expired one is an error in the log, not a refusal to start:
		// callers that do not verify it, and every node, still get through.
		if err := tlsca.Check(log, time.Now(), []tlsca.Expiry{exp}); err != nil {
			log.Error("tls: " + err.Error())
		}
		runWhileUp(lc, func(ctx context.Context) { watchExpiry(ctx, renewCheckEvery, log, exp) })
	}
	hs := httpapi.New(deps, hc.Listen, log)
	hs.AccessLog = s.Config.Log.AccessLog()
	hs.MaxConns, hs.MaxConnsPerAddr = hc.MaxConnections, hc.MaxConnectionsPerAddress
	// The web console's static files need no key; the data it shows comes
	// from the API routes above, under their own scopes.
	ui := console.Handler()
	hs.Handle("GET /ui", httpapi.Access{Public: true}, ui)
	hs.Handle("GET "+console.Prefix, httpapi.Access{Public: true}, ui)
	return hs, nil
}

// runEdge starts the listeners synchronously (a busy port fails start-up),
// reloads on SIGHUP, and on stop closes HTTP first, then the node links.
func runEdge(lc fx.Lifecycle, _ *metricsServer, s EdgeSettings, log *slog.Logger, ts *transport.Server, hs *httpapi.Server,
	submit *edgeapp.SubmitRunHandler, reload *edgeapp.ReloadHandler, bus *eventbus.Bus, catalog *edgeapp.ModelCatalog,
	reg *edgeapp.RegisterHandler, rc *edgeapp.HistoryReconciler, dir ports.NodeDirectory) {
	hup := make(chan os.Signal, 1)
	hupDone := make(chan struct{})
	// A SIGHUP reload waits on nodes (config pushes, up to the reload's
	// timeout); stopping cancels it rather than waiting for it.
	hupCtx, hupCancel := context.WithCancel(context.Background())
	// The model catalog follows node lifecycle events (discover on register
	// and refresh, forget on disconnect) and refreshes every minute.
	catCtx, catCancel := context.WithCancel(context.Background())
	var catWG sync.WaitGroup
	sub := bus.Subscribe(256, func(ev domain.BusEvent) bool {
		return ev.Type == domain.BusNodeRegistered || ev.Type == domain.BusNodeConfigRefreshed || ev.Type == domain.BusNodeDisconnected
	})
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			if err := ts.Start(); err != nil {
				return err
			}
			if err := hs.Start(); err != nil {
				_ = ts.Stop(context.Background())
				return err
			}
			// Nodes removed from edge.yaml while the edge was stopped are
			// refused from now on: the rows they left running are ended
			// node_removed, on the reconciler's goroutine (reg.Close
			// stops it), so a slow history does not hold up the start.
			rc.SettleUnconfigured(dir)
			catWG.Add(2)
			go func() { defer catWG.Done(); catalog.Follow(catCtx, sub.C()) }()
			go func() { defer catWG.Done(); catalog.Run(catCtx, time.Minute) }()
			signal.Notify(hup, syscall.SIGHUP)
			go func() {
				defer close(hupDone)
				for range hup {
					if s.ConfigPath == "" {
						continue
					}
					// Handle logs a reload it refuses, the one way an admin's
					// reload fails: logged here too, each refusal was two
					// error lines.
					_, _ = reload.Handle(hupCtx)
				}
			}()
			log.Info("iop-edge started", "transport", ts.Addr().String(), "http", hs.Addr().String(), "version", Version)
			return nil
		},
		OnStop: func(ctx context.Context) error {
			// Still caught afterwards (CatchHangup): a reload sent while
			// the edge stops does not kill it.
			signal.Stop(hup)
			close(hup)
			hupCancel()
			// The reload under way ends once its pushes see hupCtx end;
			// even if it does not, the rest of the edge still stops in time.
			var err error
			select {
			case <-hupDone:
			case <-ctx.Done():
				err = fmt.Errorf("a SIGHUP reload did not end: %w", ctx.Err())
			}
			// Requests and tunnels still streaming may use the stop's time
			// but not all of it: what follows (the link, and the history's
			// last writes, whose hook fx skips once the time is up) keeps
			// its share, and a tunnel still open then is cut.
			hctx, hcancel := withReserve(ctx, stopReserve)
			herr := hs.Stop(hctx)
			hcancel()
			if herr != nil && ctx.Err() == nil {
				// Its share ran out, not the stop's: that is the cut above.
				log.Warn("HTTP requests still open when the stop's time for them ran out were cut", "err", herr)
				herr = nil
			}
			if err == nil {
				err = herr
			}
			catCancel()
			sub.Close()
			catWG.Wait()
			// The runs whose streams the HTTP server's stop cut are being
			// cancelled on their nodes: their ends (cancelled, "edge
			// shutting down") reach the history while the links are up,
			// within settleMost and the time the stop keeps for the rest.
			rctx, rcancel := withReserve(ctx, stopReserve)
			sctx, scancel := context.WithTimeout(rctx, settleMost)
			submit.Settle(sctx)
			scancel()
			rcancel()
			submit.Stop()
			if terr := ts.Stop(ctx); err == nil {
				err = terr
			}
			reg.Close()
			bus.Close()
			return err
		},
	})
}

// settleMost bounds the stop's wait for the runs it cancelled to end on
// their nodes: an exec run's SIGTERM grace and output fit in it (as in a
// node's own stop), a node that does not answer holds the stop no longer.
const settleMost = 5 * time.Second

// stopReserve is the part of the edge's stop time its HTTP server leaves
// to the rest of the stop (at most half of the time).
const stopReserve = 3 * time.Second

// withReserve is ctx ending reserve before ctx's deadline, or halfway to
// it when less than twice reserve is left.
func withReserve(ctx context.Context, reserve time.Duration) (context.Context, context.CancelFunc) {
	deadline, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	left := time.Until(deadline)
	return context.WithDeadline(ctx, deadline.Add(-min(reserve, left/2)))
}

// adminKeys reports whether an API key name holds the admin scope. The keys
// are read at start (a reload does not change them), so the set is fixed.
func adminKeys(hc config.HTTPConfig) func(string) bool {
	admins := map[string]bool{}
	for _, k := range hc.ResolvedKeys() {
		if k.Principal.Allows(domain.ScopeAdmin) {
			admins[k.Principal.Name] = true
		}
	}
	return func(name string) bool { return admins[name] }
}

// sharedEdgeID is this edge's id on a history other edges may share (the
// handlers' Edge), "" on an SQLite one: that is this edge's alone, and a
// row under another id is this edge's under an earlier host name.
func sharedEdgeID(st *edgestore.Store) string {
	if !st.Shared() {
		return ""
	}
	return st.EdgeID()
}

// warnUnknownKeyNodes warns of each node an API key is limited to that
// nodes[] does not list: a misspelt id ("gpu1" for "gpu-1") left the key
// without its node, every request of it answered as if the node were not
// connected, and nothing said why. It is a warning, not a refusal: a
// reload may add the node later (api_keys are read at start only). Each
// reload, once accepted, checks again against its nodes[]: it warns of a
// key's node the file dropped, and again of one it still does not list.
func warnUnknownKeyNodes(log *slog.Logger, keys []config.APIKeyEntry, nodes []string) {
	known := make(map[string]bool, len(nodes))
	for _, id := range nodes {
		known[id] = true
	}
	for _, k := range keys {
		for _, id := range k.Nodes {
			if !known[id] {
				log.Warn("an API key is limited to a node that nodes[] does not list: the key cannot use that node until a reload adds it (a misspelt node id?)",
					"key", k.Name, "node", id)
			}
		}
	}
}

func nodeIDs(nodes []config.NodeEntry) []string {
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	return ids
}
