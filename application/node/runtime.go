// Package node holds the node's use cases: applying pushed config, executing
// runs (admission, terminal synthesis), cancel, session termination, node
// commands and the provider tunnel.
package node

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"iop/domain"
	"iop/ports"
)

// instance is one built runtime adapter. A config refresh retires an
// instance; it is closed once its last run has finished.
type instance struct {
	cfg     domain.AdapterConfig
	adapter ports.RuntimeAdapter
	caps    domain.Capabilities // caps.MaxConcurrency is at least 1
	retired bool
	active  int // runs on this instance
}

// Runtime holds the node's runtime adapter instances, by configured name.
type Runtime struct {
	factory ports.AdapterFactory
	log     *slog.Logger

	provCmds ports.ProviderCommands

	mu        sync.Mutex
	byName    map[string]*instance
	providers map[string]domain.ProviderConfig
	// provRunners serve command families for providers (ollama.* for an
	// Ollama declared only as a provider), rebuilt on every Apply.
	provRunners map[string]providerRunner
	nodeID      string
	version     uint64
	// inFlight counts the runs of each adapter name, on whichever instance
	// they run: a refresh that rebuilds an adapter (any change to its
	// config, a timeout say) leaves its runs on the retired instance, and
	// they still hold slots of the name's max_concurrency, which is the
	// newest instance's. Counted per instance, every refresh would add a
	// whole max_concurrency of runs. An entry exists only while positive.
	inFlight map[string]int
	// children counts runs in flight on instances of a type that spawns a
	// process, each counted by its own instance's type: a refresh that
	// removes the adapter, or changes its type, leaves them running.
	children int
}

// NewRuntime returns an empty runtime; Apply installs adapters.
func NewRuntime(factory ports.AdapterFactory, log *slog.Logger) *Runtime {
	if factory == nil {
		panic("node.NewRuntime: nil factory")
	}
	if log == nil {
		log = slog.Default()
	}
	return &Runtime{factory: factory, log: log, byName: map[string]*instance{}, providers: map[string]domain.ProviderConfig{}, inFlight: map[string]int{}}
}

// providerRunner is a provider's command runner and the commands it serves.
type providerRunner struct {
	runner ports.CommandRunner
	names  []string
}

// WithProviderCommands lets providers serve node commands; call it before
// the first Apply.
func (rt *Runtime) WithProviderCommands(pc ports.ProviderCommands) *Runtime {
	rt.provCmds = pc
	return rt
}

// providerRunnerFor returns a command runner serving name: the provider
// named want, or, when want is empty, the first (by name) that serves it.
func (rt *Runtime) providerRunnerFor(name, want string) (ports.CommandRunner, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	names := make([]string, 0, len(rt.provRunners))
	for n := range rt.provRunners {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		pr := rt.provRunners[n]
		if (want == "" || want == n) && slices.Contains(pr.names, name) {
			return pr.runner, true
		}
	}
	return nil, false
}

// providerCommandNames lists the commands providers serve.
func (rt *Runtime) providerCommandNames() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var out []string
	for _, pr := range rt.provRunners {
		out = append(out, pr.names...)
	}
	return out
}

// Apply installs cfg, all or nothing. Adapters whose config did not change
// keep their instance (and their runs); changed or removed ones are retired
// and closed when idle. If any adapter fails to build, nothing changes
// (adapters, providers and version stay as they were) and the failures are
// returned together: the edge keeps its view of the node's config when the
// node acks an error, so the node must still run exactly that config.
func (rt *Runtime) Apply(cfg domain.NodeConfig) error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	next := map[string]*instance{}
	var built []*instance // new instances, closed again if cfg is refused
	var errs []error
	for _, ac := range cfg.Adapters {
		if old, ok := rt.byName[ac.Name]; ok && reflect.DeepEqual(old.cfg, ac) {
			next[ac.Name] = old
			continue
		}
		a, err := rt.factory.Build(ac)
		if err != nil {
			errs = append(errs, fmt.Errorf("adapter %q: %w", ac.Name, err))
			continue
		}
		caps := a.Capabilities()
		if caps.MaxConcurrency <= 0 {
			caps.MaxConcurrency = max(ac.MaxConcurrency, 1)
		}
		in := &instance{cfg: ac, adapter: a, caps: caps}
		next[ac.Name] = in
		built = append(built, in)
	}
	if len(errs) > 0 {
		for _, in := range built {
			rt.closeInstance(in)
		}
		return errors.Join(errs...)
	}
	for name, old := range rt.byName {
		if next[name] != old {
			old.retired = true
			if old.active == 0 {
				rt.closeInstance(old)
			}
		}
	}
	rt.byName = next
	rt.providers = map[string]domain.ProviderConfig{}
	for _, pr := range rt.provRunners {
		if c, ok := pr.runner.(io.Closer); ok {
			_ = c.Close()
		}
	}
	rt.provRunners = map[string]providerRunner{}
	for _, p := range cfg.Providers {
		rt.providers[p.Name] = p
		if rt.provCmds != nil {
			if r, names, ok := rt.provCmds.CommandsFor(p); ok {
				rt.provRunners[p.Name] = providerRunner{runner: r, names: names}
			}
		}
	}
	rt.nodeID, rt.version = cfg.NodeID, cfg.Version
	return nil
}

func (rt *Runtime) closeInstance(in *instance) {
	if c, ok := in.adapter.(io.Closer); ok {
		if err := c.Close(); err != nil {
			rt.log.Warn("closing retired adapter", "adapter", in.cfg.Name, "err", err)
		}
	}
}

// acquire takes a concurrency slot of adapter name on its current instance,
// or fails at once with adapter_not_found or at_capacity: runs are never
// queued silently. Slots are counted per name (inFlight), so runs left on
// a retired instance count too.
func (rt *Runtime) acquire(name string) (*instance, func(), error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	in, ok := rt.byName[name]
	if !ok {
		return nil, nil, domain.Errorf(domain.CodeAdapterNotFound, "adapter %q is not configured on this node (have: %s)", name, strings.Join(rt.namesLocked(), ", "))
	}
	if used := rt.inFlight[name]; used >= in.caps.MaxConcurrency {
		return nil, nil, domain.Errorf(domain.CodeAtCapacity, "adapter %q is running %d of %d runs", name, used, in.caps.MaxConcurrency)
	}
	rt.inFlight[name]++
	in.active++
	child := spawnsProcesses(in.cfg.Type)
	if child {
		rt.children++
	}
	var once sync.Once
	return in, func() {
		once.Do(func() {
			rt.mu.Lock()
			defer rt.mu.Unlock()
			if rt.inFlight[name]--; rt.inFlight[name] <= 0 {
				delete(rt.inFlight, name)
			}
			if child {
				rt.children--
			}
			in.active--
			if in.retired && in.active == 0 {
				rt.closeInstance(in)
			}
		})
	}, nil
}

// lookup returns the current instance of adapter name.
func (rt *Runtime) lookup(name string) (*instance, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	in, ok := rt.byName[name]
	return in, ok
}

func (rt *Runtime) namesLocked() []string {
	names := make([]string, 0, len(rt.byName))
	for n := range rt.byName {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Statuses describes every configured adapter, sorted by name: its current
// instance's capacity and the runs in flight under its name.
func (rt *Runtime) Statuses() []domain.AdapterStatus {
	out := []domain.AdapterStatus{}
	for _, in := range rt.instances() {
		out = append(out, domain.AdapterStatus{Name: in.cfg.Name, Type: in.cfg.Type, MaxConcurrency: in.caps.MaxConcurrency, InFlight: in.inFlight, Sessions: in.caps.Sessions})
	}
	return out
}

// loadedInstance is a current instance with the runs in flight under its
// adapter's name (on it or on instances a refresh retired).
type loadedInstance struct {
	*instance
	inFlight int
}

// instances returns the current instances, sorted by name.
func (rt *Runtime) instances() []loadedInstance {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make([]loadedInstance, 0, len(rt.byName))
	for _, name := range rt.namesLocked() {
		out = append(out, loadedInstance{instance: rt.byName[name], inFlight: rt.inFlight[name]})
	}
	return out
}

// slots returns each adapter's slots, sorted by name: the current
// instances', and for a name a refresh removed (or renamed) while runs of
// it go on, those runs with Max 0, until they end.
func (rt *Runtime) slots() []domain.AdapterSlots {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make([]domain.AdapterSlots, 0, len(rt.byName))
	for name, in := range rt.byName {
		out = append(out, domain.AdapterSlots{Name: name, Max: in.caps.MaxConcurrency, InFlight: rt.inFlight[name]})
	}
	for name, n := range rt.inFlight {
		if _, ok := rt.byName[name]; !ok && n > 0 {
			out = append(out, domain.AdapterSlots{Name: name, InFlight: n})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// childProcesses counts the runs in flight that are child processes.
func (rt *Runtime) childProcesses() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.children
}

// Provider returns the provider named name from the pushed config.
func (rt *Runtime) Provider(name string) (domain.ProviderConfig, bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	p, ok := rt.providers[name]
	return p, ok
}

// Version returns the node id and config version in force.
func (rt *Runtime) Version() (string, uint64) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.nodeID, rt.version
}

// Close closes every instance; for node shutdown after runs have ended.
func (rt *Runtime) Close() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, in := range rt.byName {
		rt.closeInstance(in)
	}
	rt.byName = map[string]*instance{}
}
