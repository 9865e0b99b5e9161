package edge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// ModelEntry is one model one provider of one node serves.
type ModelEntry struct {
	ID       string
	Node     string
	Provider string
	Type     string // the provider's type: domain.ProviderOpenAI, ProviderOllama or ProviderAnthropic
	// Created is the model's creation time in Unix seconds as the provider
	// reported it (OpenAI's "created", Ollama's "modified_at"); else the
	// time the node connected.
	Created int64
	// Raw is the provider's own /api/tags entry for discovered Ollama
	// models (so the merged tags list keeps size, digest and details); nil
	// otherwise.
	Raw []byte
}

// Speaks reports whether a provider of type typ answers requests of the API
// family family (domain.ProviderOpenAI, ProviderOllama or ProviderAnthropic).
// Ollama serves the OpenAI-compatible and Anthropic Messages APIs next to its
// own, so ollama providers speak all three; OpenAI-compatible servers (vLLM,
// LiteLLM and other gateways) commonly serve Anthropic Messages too, so
// openai providers speak openai and anthropic (one that does not answers
// with its own 404); anthropic providers speak only anthropic.
func Speaks(typ, family string) bool {
	switch typ {
	case domain.ProviderOllama:
		return true
	case domain.ProviderOpenAI:
		return family == domain.ProviderOpenAI || family == domain.ProviderAnthropic
	}
	return typ == family
}

// MatchModel reports whether a requested model name names the served one:
// exactly, or with Ollama's implicit ":latest" tag ("llama3.2" serves a
// request for "llama3.2:latest" and the other way round).
func MatchModel(served, requested string) bool {
	return served == requested || strings.TrimSuffix(served, ":latest") == strings.TrimSuffix(requested, ":latest")
}

// MatchProviderModel reports whether a provider of type typ serving served
// serves a request for requested: as MatchModel says, and for an anthropic
// provider also by the aliases Anthropic serves a dated model under, which
// its Models API does not list — the id without its -YYYYMMDD suffix
// ("claude-sonnet-4-5" for claude-sonnet-4-5-20250929), with -latest in
// its place ("claude-3-7-sonnet-latest") or, for a bare major version, -0
// ("claude-opus-4-0" for claude-opus-4-20250514) — and the other way
// round, a declared alias serving the dated ids it names. Two different
// dated ids never match each other. The provider resolves the name
// itself; the edge only has to know it serves it.
func MatchProviderModel(typ, served, requested string) bool {
	if MatchModel(served, requested) {
		return true
	}
	if typ == domain.ProviderOllama {
		return OllamaName(served) == OllamaName(requested)
	}
	if typ != domain.ProviderAnthropic {
		return false
	}
	if base, ok := undated(served); ok {
		// A listed dated id serves its aliases.
		return slices.Contains(anthropicAliases(base), requested)
	}
	// A declared alias serves the dated ids it stands for (Claude Code
	// asks for claude-sonnet-4-5-20250929 where the config says
	// claude-sonnet-4-5), and its other spellings.
	if base, ok := undated(requested); ok {
		return slices.Contains(anthropicAliases(base), served)
	}
	for _, b := range []string{strings.TrimSuffix(served, "-latest"), strings.TrimSuffix(served, "-0")} {
		if b != served && slices.Contains(anthropicAliases(b), requested) {
			return true
		}
	}
	return false
}

// anthropicAliases are the names Anthropic serves a model of undated id
// base under: base itself, base-latest, and for a bare major version
// (claude-opus-4) base-0 (claude-opus-4-0).
func anthropicAliases(base string) []string {
	names := []string{base, base + "-latest"}
	// A bare major version ends in a number after a name (opus-4), not
	// after another number (sonnet-4-5, a minor version already).
	segs := strings.Split(base, "-")
	if n := len(segs); n >= 2 && digits(segs[n-1]) && !digits(segs[n-2]) {
		names = append(names, base+"-0")
	}
	return names
}

func digits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// OllamaName is a model name in the form Ollama resolves it to, so that two
// names one Ollama server takes for the same model compare equal: without
// the default registry ("registry.ollama.ai/") and namespace ("library/"),
// with the default tag (":latest") when it has none, and in lower case
// (Ollama matches names case-insensitively). "Library/Llama3.2",
// "registry.ollama.ai/library/llama3.2:latest" and "llama3.2" are all
// "llama3.2:latest"; "hf.co/org/model:Q4_K_M" keeps its host and namespace.
func OllamaName(name string) string {
	n := strings.ToLower(name)
	n = strings.TrimPrefix(n, "registry.ollama.ai/")
	n = strings.TrimPrefix(n, "library/")
	if n == "" {
		return n
	}
	if !strings.Contains(n[strings.LastIndexByte(n, '/')+1:], ":") {
		n += ":latest"
	}
	return n
}

// undated is id without its -YYYYMMDD suffix; ok is false when it has none.
func undated(id string) (base string, ok bool) {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || len(id)-i-1 != 8 {
		return "", false
	}
	for _, c := range []byte(id[i+1:]) {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return id[:i], true
}

// ModelCatalog knows which models each connected node's providers serve:
// the models declared in the provider config, or else the list discovered
// from the provider itself through a tunnel (GET /v1/models for openai
// providers, GET /api/tags for ollama ones). It is safe for concurrent use.
//
// Reads always go through the registry, so a node that disconnects drops
// out at once and a reconnected node is not served a stale list. A provider
// whose list could not be discovered yet is "unknown": it is left out of
// Models but still a routing candidate of last resort (see
// SubmitProviderTunnelHandler).
type ModelCatalog struct {
	reg   *Registry
	lists ports.ModelLister
	log   *slog.Logger
	now   func() time.Time

	// DiscoveryTimeout bounds one provider's discovery (default 15 s).
	DiscoveryTimeout time.Duration
	// MaxListBytes bounds a discovered model list's body (default 8 MiB).
	MaxListBytes int64
	// MaxListModels bounds the models kept of one provider's discovered
	// list (default DefaultMaxListModels): the first ones it lists.
	MaxListModels int
	// MinRefreshGap is the least time between the starts of two refresh
	// rounds callers trigger through RefreshedSince (default 200 ms).
	MinRefreshGap time.Duration

	mu         sync.Mutex
	nodes      map[string]*nodeModels
	refreshing chan struct{} // RefreshedSince: closed when the round under way ends
	roundStart time.Time     // when the latest round started
	doneStart  time.Time     // when the latest finished round started
}

// nodeModels is what discovery learned about one node over one link.
type nodeModels struct {
	link      ports.NodeLink
	version   uint64                  // of the node config the lists were discovered for
	providers map[string]discovered   // provider name → list
	failures  map[string]failureCount // provider name → its discovery failures since it last answered
}

// failureCount is a provider's discovery failures in a row: logged when
// last logged, n not logged since.
type failureCount struct {
	provider string
	logged   time.Time
	n        int
	err      error
}

// discoveryLogEvery is the most often one provider's discovery failures
// are logged (rounds callers trigger may run five times a second).
const discoveryLogEvery = 10 * time.Second

// maxNodeDiscoveries bounds the providers of one node asked at once.
const maxNodeDiscoveries = 8

// discovered is one provider's discovered list and the config it came from.
type discovered struct {
	cfg    domain.ProviderConfig
	models []ModelEntry
	listed int // models the provider listed: more than len(models) when over MaxListModels
}

// DefaultMaxListModels is the default ModelCatalog.MaxListModels. Real
// providers list a few hundred models at most; a list over 8 MiB of short
// ids would otherwise keep hundreds of thousands, which every model list
// request copies, sorts and encodes.
const DefaultMaxListModels = 10_000

// NewModelCatalog refuses a nil registry or lister.
func NewModelCatalog(reg *Registry, lists ports.ModelLister, log *slog.Logger) *ModelCatalog {
	if reg == nil || lists == nil {
		panic("edge.NewModelCatalog: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	return &ModelCatalog{reg: reg, lists: lists, log: log, now: time.Now, DiscoveryTimeout: 15 * time.Second, MaxListBytes: 8 << 20, MaxListModels: DefaultMaxListModels, MinRefreshGap: 200 * time.Millisecond,
		nodes: map[string]*nodeModels{}}
}

// Refresh rediscovers the model lists of node's providers that declare no
// models, asking them concurrently, each under its own DiscoveryTimeout. A
// provider whose discovery fails keeps its previous list, if it had one
// over the same link; the failures are logged (at most one line per
// provider per discoveryLogEvery, with a count) and returned joined. Refreshing
// a node that is not connected forgets it and returns node_not_found.
func (c *ModelCatalog) Refresh(ctx context.Context, node string) error {
	view, ok := c.reg.Get(node)
	if !ok {
		c.mu.Lock()
		delete(c.nodes, node)
		c.mu.Unlock()
		return domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", node)
	}
	// The providers are asked concurrently, each under its own
	// DiscoveryTimeout, so one that hangs does not use up the others' time.
	type result struct {
		cfg    domain.ProviderConfig
		models []ModelEntry
		listed int
		err    error
	}
	var (
		results []*result
		wg      sync.WaitGroup
		sem     = make(chan struct{}, maxNodeDiscoveries)
	)
	for _, p := range view.Config.Providers {
		if len(p.Models) > 0 {
			continue
		}
		r := &result{cfg: p}
		results = append(results, r)
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			r.models, r.listed, r.err = c.discover(ctx, view, p)
		}()
	}
	wg.Wait()
	found := map[string]discovered{}
	failed := map[string]error{}
	var errs []error
	for _, r := range results {
		if r.err != nil {
			err := fmt.Errorf("discover models of provider %s on node %s: %w", r.cfg.Name, node, r.err)
			errs = append(errs, err)
			failed[r.cfg.Name] = err
			continue
		}
		found[r.cfg.Name] = discovered{cfg: r.cfg, models: r.models, listed: r.listed}
	}
	var (
		capped []discovered   // lists cut to MaxListModels, to warn about once
		report []failureCount // failures to log, at most one line per provider per discoveryLogEvery
	)
	defer func() {
		for _, d := range capped {
			c.log.Warn("provider lists more models than the edge keeps; the rest are not served", "node", node, "provider", d.cfg.Name, "listed", d.listed, "kept", len(d.models))
		}
		for _, f := range report {
			c.log.Warn("model discovery failed", "node", node, "provider", f.provider, "failures", f.n, "err", f.err)
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.nodes[node]
	// Discoveries of one node run concurrently (a registration's, a
	// reload's, the periodic one): one begun on a link the node has left,
	// or for a config a newer discovery already followed, must not replace
	// that newer list (the node's models would be unlisted until the next
	// round).
	if cur, ok := c.reg.Get(node); !ok || cur.Link != view.Link {
		return errors.Join(errs...)
	}
	if prev != nil && prev.link == view.Link && prev.version > view.Config.Version {
		return errors.Join(errs...)
	}
	next := &nodeModels{link: view.Link, version: view.Config.Version, providers: found, failures: map[string]failureCount{}}
	now := c.now()
	for name, err := range failed {
		var f failureCount
		if prev != nil && prev.link == view.Link {
			f = prev.failures[name]
		}
		f.provider, f.n, f.err = name, f.n+1, err
		// A round cut short by the caller (the edge stopping) is no
		// provider's fault.
		if ctx.Err() == nil && (f.logged.IsZero() || now.Sub(f.logged) >= discoveryLogEvery) {
			report = append(report, f)
			f.logged, f.n = now, 0
		}
		next.failures[name] = f
	}
	for name, d := range found {
		if d.listed <= len(d.models) {
			continue
		}
		// Warn once per provider and link, again only if its count changes.
		if prev == nil || prev.link != view.Link || prev.providers[name].listed != d.listed {
			capped = append(capped, d)
		}
	}
	if prev != nil && prev.link == view.Link {
		for name, d := range prev.providers {
			if _, ok := found[name]; !ok {
				next.providers[name] = d // keep the last good list on failure
			}
		}
	}
	c.nodes[node] = next
	return errors.Join(errs...)
}

// RefreshAll refreshes every connected node concurrently and forgets nodes
// that are gone. Failures are logged (by Refresh), not returned.
func (c *ModelCatalog) RefreshAll(ctx context.Context) {
	views := c.reg.List()
	live := map[string]bool{}
	var wg sync.WaitGroup
	for _, v := range views {
		live[v.ID] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.Refresh(ctx, v.ID) // logs its providers' failures
		}()
	}
	wg.Wait()
	c.mu.Lock()
	for id := range c.nodes {
		if !live[id] {
			delete(c.nodes, id)
		}
	}
	c.mu.Unlock()
}

// Run refreshes every connected node now and then every interval until ctx
// ends; it returns when ctx is done. The caller owns the goroutine.
func (c *ModelCatalog) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		c.RefreshAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Follow keeps the catalog in step with node lifecycle events read from
// events (a bus subscription filtered or not): a node that registers or has
// its config refreshed is rediscovered, one that disconnects is forgotten.
// Discoveries run concurrently; Follow returns, after they have, when ctx
// ends or events is closed. The caller owns the goroutine.
func (c *ModelCatalog) Follow(ctx context.Context, events <-chan domain.BusEvent) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			switch ev.Type {
			case domain.BusNodeRegistered, domain.BusNodeConfigRefreshed:
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = c.Refresh(ctx, ev.Node) // logs its providers' failures
				}()
			case domain.BusNodeDisconnected:
				if _, live := c.reg.Get(ev.Node); !live {
					c.mu.Lock()
					delete(c.nodes, ev.Node)
					c.mu.Unlock()
				}
			}
		}
	}
}

// RefreshedSince makes sure the catalog reflects the providers as they were
// at since or later: it returns once a refresh of every connected node that
// started at or after since has finished (or ctx ends). Callers pass the
// time their request arrived, so a model pulled or copied just before is
// seen. Concurrent callers share rounds, and rounds start at most once per
// MinRefreshGap, so a stream of misses or list requests costs at most one
// discovery round per gap, however many callers wait on it.
func (c *ModelCatalog) RefreshedSince(ctx context.Context, since time.Time) {
	for {
		c.mu.Lock()
		if !c.doneStart.IsZero() && !c.doneStart.Before(since) {
			c.mu.Unlock()
			return // a round that started late enough has finished
		}
		if ch := c.refreshing; ch != nil {
			started := c.roundStart
			c.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return
			}
			if !started.Before(since) {
				return
			}
			continue // that round was too early for us; start or join the next
		}
		if wait := c.MinRefreshGap - c.now().Sub(c.roundStart); !c.roundStart.IsZero() && wait > 0 {
			c.mu.Unlock()
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		ch := make(chan struct{})
		start := c.now()
		c.refreshing, c.roundStart = ch, start
		c.mu.Unlock()
		// The round belongs to every waiter, not to this caller's request:
		// one caller leaving does not cut it short for the others. It ends
		// by itself: every provider's discovery has its own DiscoveryTimeout
		// (one deadline for the whole round would let a provider that hangs
		// use it up, failing the providers asked after it).
		rctx := context.WithoutCancel(ctx)
		go func() {
			c.RefreshAll(rctx)
			c.mu.Lock()
			c.refreshing, c.doneStart = nil, start
			c.mu.Unlock()
			close(ch)
		}()
		select {
		case <-ch:
		case <-ctx.Done():
		}
		return
	}
}

// Models returns every model served by a connected node, sorted by id,
// node and provider.
func (c *ModelCatalog) Models() []ModelEntry {
	var out []ModelEntry
	for _, p := range c.providers() {
		if p.known {
			out = p.appendEntries(out)
		}
	}
	sortEntries(out)
	return out
}

// NodeModels returns the models node serves, sorted like Models, or
// node_not_found when it is not connected.
func (c *ModelCatalog) NodeModels(node string) ([]ModelEntry, error) {
	if _, ok := c.reg.Get(node); !ok {
		return nil, domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", node)
	}
	var out []ModelEntry
	for _, e := range c.Models() {
		if e.Node == node {
			out = append(out, e)
		}
	}
	return out, nil
}

// Lookup returns the entries that serve model to callers of API family
// (domain.ProviderOpenAI or domain.ProviderOllama), sorted like Models.
func (c *ModelCatalog) Lookup(family, model string) []ModelEntry {
	var out []ModelEntry
	for _, e := range c.Models() {
		if Speaks(e.Type, family) && MatchProviderModel(e.Type, e.ID, model) {
			out = append(out, e)
		}
	}
	return out
}

// providerModels is one connected provider as the catalog sees it now.
type providerModels struct {
	node      string
	cfg       domain.ProviderConfig
	known     bool         // declared, or discovered over the node's current link
	models    []ModelEntry // discovered (declared ones are cfg.Models)
	connected int64        // when the node connected (Unix s): a declared model's Created
	inFlight  int          // the node's tunnels in flight
	draining  bool         // the node is stopping (Registry.MarkDraining)
	// served is the name under which it lists the model a request asks
	// for, set by the tunnel's routing when it filters by that model.
	served string
}

// serves reports whether the provider serves model (as MatchProviderModel
// says).
func (p *providerModels) serves(model string) bool { return p.match(model) != "" }

// match is the name under which the provider serves model: the declared
// or listed one that MatchProviderModel matches to it, "" if none does.
func (p *providerModels) match(model string) string {
	if len(p.cfg.Models) > 0 {
		if i := slices.IndexFunc(p.cfg.Models, func(m string) bool { return MatchProviderModel(p.cfg.Type, m, model) }); i >= 0 {
			return p.cfg.Models[i]
		}
		return ""
	}
	if i := slices.IndexFunc(p.models, func(m ModelEntry) bool { return MatchProviderModel(p.cfg.Type, m.ID, model) }); i >= 0 {
		return p.models[i].ID
	}
	return ""
}

// appendEntries appends the provider's models to out. Declared models
// become entries only here, not on every routing of a request.
func (p *providerModels) appendEntries(out []ModelEntry) []ModelEntry {
	if len(p.cfg.Models) == 0 {
		return append(out, p.models...)
	}
	for _, m := range p.cfg.Models {
		out = append(out, ModelEntry{ID: m, Node: p.node, Provider: p.cfg.Name, Type: p.cfg.Type, Created: p.connected})
	}
	return out
}

// providers lists every provider of every connected node, nodes by id and
// providers in config order.
func (c *ModelCatalog) providers() []providerModels {
	views := c.reg.List()
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []providerModels
	for _, v := range views {
		nm := c.nodes[v.ID]
		if nm != nil && nm.link != v.Link {
			nm = nil // a reconnected node: what we learned is stale
		}
		for _, p := range v.Config.Providers {
			pm := providerModels{node: v.ID, cfg: p, inFlight: v.TunnelsInFlight, connected: v.ConnectedAt.Unix(), draining: v.Draining}
			switch {
			case len(p.Models) > 0:
				pm.known = true
			case nm != nil:
				if d, ok := nm.providers[p.Name]; ok && sameProvider(d.cfg, p) {
					pm.known, pm.models = true, d.models
				}
			}
			out = append(out, pm)
		}
	}
	return out
}

func sameProvider(a, b domain.ProviderConfig) bool {
	return a.Name == b.Name && a.Type == b.Type && a.BaseURL == b.BaseURL && a.PathPrefix == b.PathPrefix
}

func sortEntries(es []ModelEntry) {
	sort.SliceStable(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.ID != b.ID {
			return a.ID < b.ID
		}
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		return a.Provider < b.Provider
	})
}

// maxListPages bounds the pages of one provider's model list (Anthropic's
// are 1,000 models each), so a provider that always says there is more
// cannot keep discovery asking until MaxListBytes.
const maxListPages = 32

// discover asks provider p of node v for its models through a tunnel per
// page of its list; all pages together may take MaxListBytes. It keeps the
// first MaxListModels models and returns how many were listed.
func (c *ModelCatalog) discover(ctx context.Context, v NodeView, p domain.ProviderConfig) ([]ModelEntry, int, error) {
	ctx, cancel := context.WithTimeout(ctx, c.DiscoveryTimeout)
	defer cancel()
	path := c.lists.ModelListPath(p.Type)
	query, _ := c.lists.ModelListQuery(p.Type, nil)
	var (
		entries []ModelEntry
		listed  int
		used    int64
	)
	for n := 1; ; n++ {
		body, err := c.listPage(ctx, v, p, path, query, used)
		if err != nil {
			return nil, 0, err
		}
		used += int64(len(body))
		page, err := c.lists.ParseModelList(p.Type, body)
		if err != nil {
			return nil, 0, err
		}
		for _, m := range page {
			listed++
			if c.MaxListModels > 0 && len(entries) >= c.MaxListModels {
				continue
			}
			e := ModelEntry{ID: m.ID, Node: v.ID, Provider: p.Name, Type: p.Type, Created: m.Created, Raw: m.Raw}
			if e.Created == 0 {
				e.Created = v.ConnectedAt.Unix()
			}
			entries = append(entries, e)
		}
		next, more := c.lists.ModelListQuery(p.Type, body)
		switch {
		case !more:
			return entries, listed, nil
		case next == query:
			return nil, 0, domain.Errorf(domain.CodeProviderError, "GET %s?%s answered the same page again", path, query)
		case n == maxListPages:
			return nil, 0, domain.Errorf(domain.CodeProviderError, "model list longer than %d pages", maxListPages)
		}
		query = next
	}
}

// listPage GETs one page of provider p's model list; used is what earlier
// pages took of MaxListBytes.
func (c *ModelCatalog) listPage(ctx context.Context, v NodeView, p domain.ProviderConfig, path, query string, used int64) ([]byte, error) {
	req := domain.TunnelRequest{Provider: p.Name, Method: "GET", Path: path, Query: query, Header: domain.Header{"Accept": {"application/json"}}}
	st, err := v.Link.OpenTunnel(ctx, req, nil)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	status, body, err := readAll(ctx, st, c.MaxListBytes, used)
	if err != nil {
		return nil, err
	}
	if status < 200 || status > 299 {
		return nil, domain.Errorf(domain.CodeProviderError, "GET %s answered %d", path, status)
	}
	return body, nil
}

// readAll collects a tunnel's status and body, up to limit bytes less the
// used ones.
func readAll(ctx context.Context, st ports.TunnelStream, limit, used int64) (int, []byte, error) {
	var status int
	var body []byte
	for {
		f, err := st.Recv(ctx)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = domain.Errorf(domain.CodeNodeDisconnected, "tunnel ended without an end frame")
			}
			return 0, nil, err
		}
		switch f.Kind {
		case domain.TunnelStatus:
			status = f.Status
		case domain.TunnelBody:
			if used+int64(len(body)+len(f.Body)) > limit {
				return 0, nil, domain.Errorf(domain.CodeProviderError, "model list larger than %d bytes", limit)
			}
			body = append(body, f.Body...)
		case domain.TunnelError:
			if f.Error == nil {
				return 0, nil, domain.Errorf(domain.CodeProviderError, "tunnel failed")
			}
			return 0, nil, &domain.Error{Code: f.Error.Code, Message: f.Error.Message}
		case domain.TunnelEnd:
			return status, body, nil
		}
	}
}
