package edge

import (
	"context"
	"log/slog"
	"reflect"
	"sort"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// ReloadResult says what a reload changed.
type ReloadResult struct {
	Nodes        int      `json:"nodes"`
	Refreshed    []string `json:"refreshed"`
	Disconnected []string `json:"disconnected"`
	Unchanged    []string `json:"unchanged"`
	Failed       []string `json:"failed,omitempty"`
	// NeedsRestart names the settings outside nodes[] that changed in the
	// file: the edge read them at start, a reload leaves them as they
	// were, and they take effect after a restart. Names only, never values.
	NeedsRestart []string `json:"needs_restart,omitempty"`
}

// ReloadHandler re-reads the node directory and brings connected nodes in
// line with it: changed nodes get their new config pushed, removed nodes and
// nodes whose token changed are disconnected. An unreadable or invalid
// source is rejected whole and nothing changes.
type ReloadHandler struct {
	src      ports.NodeSource
	dir      Directory
	reg      *Registry
	bus      ports.EventPublisher
	versions *ConfigVersions
	log      *slog.Logger
	mu       sync.Mutex // one reload at a time
	timeout  time.Duration
	// Reconcile, if set, ends the running history rows of the nodes a
	// reload removes (NodeRemoved): refused from then on, they never
	// register again to settle them.
	Reconcile *HistoryReconciler
	// Accepted, if set, is called with the records of each reload once the
	// directory holds them, one reload at a time. A refused reload (the
	// source unreadable, a node's config not building) does not call it:
	// the old records stay in force, so what is said of the new ones
	// (a key limited to a node they no longer list) would not be true.
	Accepted func([]domain.NodeRecord)
}

// reloadPushes bounds the config pushes one reload has in flight at once.
const reloadPushes = 16

// Directory is what reload needs of the node directory.
type Directory interface {
	ports.NodeDirectory
	ports.DirectoryReplacer
}

// NewReloadHandler refuses nil dependencies.
func NewReloadHandler(src ports.NodeSource, dir Directory, reg *Registry, bus ports.EventPublisher, versions *ConfigVersions, log *slog.Logger) *ReloadHandler {
	if src == nil || dir == nil || reg == nil || bus == nil || versions == nil {
		panic("edge.NewReloadHandler: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	return &ReloadHandler{src: src, dir: dir, reg: reg, bus: bus, versions: versions, log: log, timeout: 10 * time.Second}
}

// Handle performs one reload.
// A caller limited to some nodes is refused (forbidden): a reload acts on
// every node and its answer names them all.
func (h *ReloadHandler) Handle(ctx context.Context) (ReloadResult, error) {
	p := domain.PrincipalFrom(ctx)
	if err := p.Require(domain.ScopeAdmin); err != nil {
		return ReloadResult{}, err
	}
	if p.Limited() {
		return ReloadResult{}, domain.Errorf(domain.CodeForbidden, "API key %q is limited to some nodes; a reload acts on every node and needs a key without a nodes limit", p.Name)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	recs, needsRestart, err := h.src.LoadNodes()
	if err != nil {
		h.log.Error("reload rejected; old config stays in force", "err", err)
		return ReloadResult{}, domain.Errorf(domain.CodeConfigError, "%v", err)
	}
	// Every node's payload must build before anything changes, so a file
	// with an adapter the edge cannot build (no type, a bad base_url) is
	// rejected whole like a YAML error. edge.yaml's loader runs the same
	// check (so the edge does not start on such a file either); this one
	// holds for any NodeSource.
	for _, r := range recs {
		if _, err := r.BuildConfig(0); err != nil {
			h.log.Error("reload rejected; old config stays in force", "node", r.ID, "err", err)
			return ReloadResult{}, domain.Errorf(domain.CodeConfigError, "node %s: %s", r.ID, domain.MessageOf(err))
		}
	}
	old := map[string]domain.NodeRecord{}
	for _, r := range h.dir.Records() {
		old[r.ID] = r
	}
	next := map[string]domain.NodeRecord{}
	for _, r := range recs {
		next[r.ID] = r
	}
	res := ReloadResult{Nodes: len(recs), Refreshed: []string{}, Disconnected: []string{}, Unchanged: []string{}, NeedsRestart: needsRestart}
	type change struct {
		n   NodeView
		rec domain.NodeRecord
	}
	var changed []change
	type closure struct {
		n      NodeView
		reason string
	}
	var closing []closure
	// No registration may authenticate against the old directory and be
	// admitted after the walk below has looked at the registry: it would
	// stay connected though removed or rotated (see Registry.admission).
	// Config pushes wait on nodes, so they happen after, unlocked: a node
	// that reconnects meanwhile gets the new config at registration.
	h.reg.admission.Lock()
	h.dir.Replace(recs)
	for _, n := range h.reg.List() {
		rec, ok := next[n.ID]
		switch {
		case !ok:
			closing = append(closing, closure{n, "removed from config"})
			res.Disconnected = append(res.Disconnected, n.ID)
		// By digest, not field by field: a token replaced by its
		// token_sha256 (as the docs recommend) still admits the node.
		case !rec.SameToken(old[n.ID]):
			closing = append(closing, closure{n, "token changed"})
			res.Disconnected = append(res.Disconnected, n.ID)
		case runsAlready(n, rec):
			res.Unchanged = append(res.Unchanged, n.ID)
		default:
			changed = append(changed, change{n, rec})
		}
	}
	// From here on no run or tunnel goes to a node being disconnected, as
	// to one that is stopping: the links close one after another below,
	// and a run sent to one still open meanwhile would be cut, or in the
	// background ended node_removed, while the file keeps other nodes.
	for _, c := range closing {
		h.reg.MarkDraining(c.n.ID, c.n.Link)
	}
	h.reg.admission.Unlock()
	// Closing a link waits on it (a TLS close alert, its loops ending):
	// done unlocked, so registrations do not queue behind it.
	for _, c := range closing {
		c.n.Link.Close(c.reason)
	}
	for id, rec := range old {
		if _, ok := next[id]; ok {
			continue
		}
		if to, ok := renamedTo(rec, recs); ok {
			// Its sessions' histories are in its store, under its new id.
			h.reg.MoveNodeSessions(id, to)
			continue
		}
		// Its sessions' histories left with it.
		h.reg.ForgetNodeSessions(id)
		h.Reconcile.NodeRemoved(ctx, id)
	}
	// Pushes go out side by side: each waits up to h.timeout on its node,
	// so one after another a reload would take that long per unresponsive
	// node — holding up SIGHUP, an admin's request and the edge's stop.
	// At most reloadPushes at once, so a reload of many nodes does not
	// start a goroutine and a config build per node all at the same time.
	var (
		resMu sync.Mutex
		wg    sync.WaitGroup
		slots = make(chan struct{}, reloadPushes)
	)
	for _, c := range changed {
		slots <- struct{}{} // freed within h.timeout, or sooner when ctx ends
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			h.refresh(ctx, c.n, c.rec, &res, &resMu)
		}()
	}
	wg.Wait()
	sort.Strings(res.Refreshed)
	sort.Strings(res.Disconnected)
	sort.Strings(res.Unchanged)
	sort.Strings(res.Failed)
	h.bus.Publish(domain.BusEvent{Type: domain.BusConfigReloaded, Time: time.Now()})
	h.log.Info("config reloaded", "nodes", res.Nodes, "refreshed", res.Refreshed, "disconnected", res.Disconnected)
	if len(res.NeedsRestart) > 0 {
		h.log.Warn("config changes outside nodes[] take effect only after a restart; until then the edge keeps the settings it started with",
			"needs_restart", res.NeedsRestart)
	}
	if h.Accepted != nil {
		h.Accepted(recs)
	}
	return res, nil
}

// renamedTo reports the id under which rec's node stays in recs when it
// is another (the same token): it registers again under that id and goes
// on with its runs, which its rows under the old id can no longer follow
// (README, Status), and its sessions.
func renamedTo(rec domain.NodeRecord, recs []domain.NodeRecord) (string, bool) {
	for _, r := range recs {
		if r.SameToken(rec) {
			return r.ID, true
		}
	}
	return "", false
}

// runsAlready reports whether node n already runs what rec configures. It
// compares with the config the node holds (the registry's), not with the
// directory's previous record: a push that failed left the node on its old
// config, so reloading the same file must push again.
func runsAlready(n NodeView, rec domain.NodeRecord) bool {
	cfg, err := rec.BuildConfig(n.Config.Version)
	if err != nil {
		return false
	}
	return reflect.DeepEqual(cfg.Adapters, n.Config.Adapters) && reflect.DeepEqual(cfg.Providers, n.Config.Providers)
}

// refresh pushes rec's config to n and notes the outcome in res, which
// resMu guards (refreshes run concurrently).
func (h *ReloadHandler) refresh(ctx context.Context, n NodeView, rec domain.NodeRecord, res *ReloadResult, resMu *sync.Mutex) {
	note := func(list *[]string, entry string) {
		resMu.Lock()
		*list = append(*list, entry)
		resMu.Unlock()
	}
	cfg, err := rec.BuildConfig(h.versions.Next())
	if err == nil {
		err = cfg.CheckAdapterTypes(n.Info)
	}
	pushed := false
	if err == nil {
		pctx, cancel := context.WithTimeout(ctx, h.timeout)
		err = n.Link.PushConfig(pctx, cfg)
		cancel()
		pushed = true
	}
	if err != nil {
		if now, ok := h.reg.Get(n.ID); ok && now.Link != n.Link {
			// It reconnected meanwhile and got the new config when it
			// registered (the directory was replaced first).
			note(&res.Refreshed, n.ID)
			return
		}
		if pushed && domain.CodeOf(err) == domain.CodeTimeout && ctx.Err() == nil {
			// The node has the frame, or soon will, and may apply it
			// after the edge stopped waiting for its answer (the push's
			// own time ran out; a reload cancelled by the edge stopping
			// leaves the links to the stop): the edge
			// would go on routing by a config the node no longer runs.
			// The node registers again on a new link and gets the config
			// the directory now holds.
			h.log.Error("config refresh unanswered; closing the node's link so that it registers again with the new config", "node", n.ID, "err", err)
			n.Link.Close("config refresh unanswered")
			note(&res.Failed, n.ID+": "+err.Error()+" (its link was closed: it registers again with the new config)")
			return
		}
		if domain.CodeOf(err) == domain.CodeCancelled {
			// The reload was stopped (the edge stopping) before the node
			// answered; the stop closes the links itself.
			h.log.Warn("config refresh cancelled before the node answered", "node", n.ID, "err", err)
		} else {
			h.log.Error("config refresh failed", "node", n.ID, "err", err)
		}
		note(&res.Failed, n.ID+": "+err.Error())
		return
	}
	h.reg.SetConfig(n.ID, n.Link, cfg)
	note(&res.Refreshed, n.ID)
	h.bus.Publish(domain.BusEvent{Type: domain.BusNodeConfigRefreshed, Time: time.Now(), Node: n.ID})
}
