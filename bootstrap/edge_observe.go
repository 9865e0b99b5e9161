package bootstrap

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"go.uber.org/fx"

	"iop/adapters/config"
	"iop/adapters/eventbus"
	httpapi "iop/adapters/http"
	"iop/adapters/metrics/prom"
	"iop/adapters/store/edgestore"
	edgeapp "iop/application/edge"
)

// newEdgeMetrics builds the Prometheus registry over the live registry, the
// bus and the node link's certificates.
func newEdgeMetrics(reg *edgeapp.Registry, bus *eventbus.Bus, lt *LinkTLS) *prom.Metrics {
	return prom.New(prom.Sources{Registry: reg, BusDropped: bus.Dropped, LinkCerts: lt.CertExpiry})
}

// newEdgeStore opens (and migrates) the history database; a store that
// cannot be opened stops the edge from starting, with the reason. Once
// running, a database that fails only costs history rows.
func newEdgeStore(lc fx.Lifecycle, s EdgeSettings, log *slog.Logger, m *prom.Metrics, _ stateDirReady) (*edgestore.Store, error) {
	c := s.Config
	dsn := historyDSN(c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := edgestore.Open(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("store.dsn %s: %w", c.StoreDSNForLog(), err)
	}
	warnNarrowed(log, "edge store", db.Narrowed())
	edgeID := c.Store.EdgeID
	if edgeID == "" {
		edgeID, _ = os.Hostname()
		if edgestore.IsPostgres(dsn) {
			log.Warn(defaultEdgeIDWarning, "edge_id", edgeID)
		}
	}
	st := edgestore.New(db, edgestore.Options{EdgeID: edgeID, Retention: c.Store.Retention.Std(), Dropped: m.HistoryDropped, Logger: log})
	log.Info("edge store open", "dsn", c.StoreDSNForLog(), "schema", edgestore.Version(), "retention", c.Store.Retention)
	// Closed last (appended first): runs drained at shutdown are recorded.
	lc.Append(fx.Hook{OnStop: func(context.Context) error { return st.Close() }})
	return st, nil
}

// defaultEdgeIDWarning is logged by an edge whose PostgreSQL history has
// no store.edge_id: it writes and repairs its rows under its host name, and
// on PostgreSQL (which edges may share) it settles only the running rows
// written under its own id, so a new host name (a container made again)
// leaves the earlier rows to be settled one by one as they are read.
const defaultEdgeIDWarning = "store.edge_id is not set: this edge's history rows carry its host name, and on PostgreSQL it settles only the running rows written under its own id; " +
	"set a stable store.edge_id (a container's host name changes when it is made again)"

// metricsServer serves GET /metrics alone on metrics.listen, if set.
type metricsServer struct{ srv *httpapi.MetricsServer }

func newMetricsServer(lc fx.Lifecycle, s EdgeSettings, log *slog.Logger, m *prom.Metrics) *metricsServer {
	ms := &metricsServer{}
	addr := s.Config.Metrics.Listen
	if addr == "" {
		return ms
	}
	if !config.IsLoopbackListen(addr) {
		log.Warn("metrics.listen is not a loopback address: GET /metrics there needs no key, so anyone who reaches it reads the node ids, adapter and model names, run and token counts of the edge; "+
			"keep it on loopback or a network only Prometheus reaches", "listen", addr)
	}
	ms.srv = httpapi.NewMetricsServer(addr, m.Handler(), log)
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			if err := ms.srv.Start(); err != nil {
				return err
			}
			log.Info("metrics listening", "addr", ms.srv.Addr().String())
			return nil
		},
		OnStop: ms.srv.Stop,
	})
	return ms
}
