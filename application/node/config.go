package node

import (
	"context"
	"log/slog"
	"os"

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
	h.warnMissingKeys(cfg)
	return nil
}

// warnMissingKeys logs one warning for each adapter and provider of cfg
// whose api_key_env variable is unset or empty in the node's environment:
// its requests go without a key, and an upstream that wants one answers
// every one 401, which alone says nothing of the node's environment. It
// names the variable only when it has the shape of one (a value of another
// shape may be the key itself), never a value.
func (h *ApplyConfigHandler) warnMissingKeys(cfg domain.NodeConfig) {
	warn := func(kind, name, env string) {
		if env == "" || os.Getenv(env) != "" {
			return
		}
		variable := env
		if !domain.ConventionalEnvName(env) {
			variable = "(not shown: not an upper-case variable name, and may be the key itself)"
		}
		h.log.Warn("api_key_env names a variable that is unset or empty in the node's environment: the "+
			kind+"'s requests carry no API key (an upstream that wants one answers each 401); "+
			"set it in iop-node's environment", kind, name, "api_key_env", variable)
	}
	for _, a := range cfg.Adapters {
		warn("adapter", a.Name, a.APIKeyEnv)
	}
	for _, p := range cfg.Providers {
		warn("provider", p.Name, p.APIKeyEnv)
	}
}
