package node

import (
	"context"
	"log/slog"

	"iop/domain"
)

// ApplyConfigHandler installs the config the edge pushes, at registration
// and on every refresh. Runs in flight keep their adapter instances.
type ApplyConfigHandler struct {
	rt  *Runtime
	log *slog.Logger

	// Latencies, if set, drops the sums of providers a config no longer
	// has when it is applied.
	Latencies *ProviderLatencies
}

// NewApplyConfigHandler refuses nil dependencies.
func NewApplyConfigHandler(rt *Runtime, log *slog.Logger) *ApplyConfigHandler {
	if rt == nil {
		panic("node.NewApplyConfigHandler: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	return &ApplyConfigHandler{rt: rt, log: log}
}

// ApplyConfig installs cfg, all or nothing: if an adapter fails to build,
// the node keeps running its previous config and the error says why.
func (h *ApplyConfigHandler) ApplyConfig(_ context.Context, cfg domain.NodeConfig) error {
	err := h.rt.Apply(cfg)
	if err != nil {
		h.log.Error("config refused; the previous config stays in force", "node", cfg.NodeID, "version", cfg.Version, "err", err)
		return err
	}
	names := make([]string, len(cfg.Providers))
	for i, p := range cfg.Providers {
		names[i] = p.Name
	}
	h.Latencies.keep(names)
	h.log.Info("config applied", "node", cfg.NodeID, "version", cfg.Version, "adapters", len(cfg.Adapters), "providers", len(cfg.Providers))
	return nil
}
