// Package factory builds runtime adapter instances from pushed config, by type.
package factory

import (
	"maps"
	"slices"

	"iop/adapters/runtime/exec"
	"iop/domain"
	"iop/ports"
)

// Builder builds one type of runtime adapter.
type Builder func(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error)

// Factory maps adapter types to builders.
type Factory struct {
	builders map[string]Builder
}

var _ ports.AdapterFactory = (*Factory)(nil)

// New returns a factory for every runtime adapter type this node supports.
func New(extra map[string]Builder) *Factory {
	f := &Factory{builders: map[string]Builder{
		domain.AdapterExec: func(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) { return exec.New(cfg) },
	}}
	for t, b := range extra {
		f.builders[t] = b
	}
	return f
}

// Types lists the adapter types this factory builds, sorted; the node
// reports them when it registers.
func (f *Factory) Types() []string {
	return slices.Sorted(maps.Keys(f.builders))
}

// Build returns a new instance for cfg, or a config_error for unknown types.
func (f *Factory) Build(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) {
	b, ok := f.builders[cfg.Type]
	if !ok {
		return nil, domain.Errorf(domain.CodeConfigError, "runtime adapter type %q is not supported by this node", cfg.Type)
	}
	return b(cfg)
}
