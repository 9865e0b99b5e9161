// Package edge holds the edge's use cases: registering nodes, dispatching
// runs, cancelling, node commands, provider tunnels and config reload.
package edge

import (
	"errors"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// LiveNode is a registered, connected node.
type LiveNode struct {
	ID          string
	Link        ports.NodeLink
	Info        domain.NodeInfo
	Remote      string
	ConnectedAt time.Time
	Config      domain.NodeConfig

	runs    map[string]int // adapter → runs in flight through this edge
	tunnels int
	// draining: the node is stopping (it said so, or refused a run with
	// shutting_down) and takes no new run; its runs in flight go on.
	draining bool
	// stopping: the node itself said so (MarkStopping), which a reload's
	// drain mark is not: its link's end is the stop, not a fault.
	stopping bool
}

// NodeView is a read-only snapshot of a live node.
type NodeView struct {
	ID              string
	Info            domain.NodeInfo
	Remote          string
	ConnectedAt     time.Time
	Config          domain.NodeConfig
	Adapters        []domain.AdapterStatus
	RunsInFlight    int
	TunnelsInFlight int
	Link            ports.NodeLink
	// RemovedAdapters are the adapters no longer in Config (a reload
	// removed them) whose runs through this edge are still in flight, by
	// name, with only Name and InFlight set; usually none. Their runs are
	// in RunsInFlight too.
	RemovedAdapters []domain.AdapterStatus
	// Draining: the node is stopping; no new run goes to it (MarkDraining).
	Draining bool
}

// Registry is the edge's set of live nodes. It is safe for concurrent use.
type Registry struct {
	mu    sync.Mutex
	nodes map[string]*LiveNode
	// gone holds when each node that left since the edge started
	// disconnected; an entry lives until the node comes back, so it holds at
	// most one time per node id ever admitted.
	gone map[string]departure
	// sessions binds each session to the node that last admitted a run of
	// it; bounded (DefaultSessionAffinity, least recently used evicted).
	sessions *sessionNodes
	// placing holds, for each session whose node a run is being placed
	// on with none bound yet, that placement (placeSession).
	placing map[sessionKey]*placement
	// draining counts the nodes in nodes marked draining, so that picking
	// a node looks for them only while there are any.
	draining int

	// admission orders registrations against reloads. A registration holds
	// it shared from checking its token against the directory until it is
	// admitted (all in memory, no I/O with the node); a reload holds it
	// exclusively from replacing the directory until it has closed the
	// links the new directory no longer allows. So a registration either
	// authenticates against the new directory or is admitted before the
	// reload looks at the registry: a node removed or given a new token is
	// never left connected. Taken before mu, never while holding it.
	admission sync.RWMutex
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{nodes: map[string]*LiveNode{}, gone: map[string]departure{}, sessions: newSessionNodes(DefaultSessionAffinity), placing: map[sessionKey]*placement{}}
}

// Admit adds n unless a node with its id is already connected.
func (r *Registry) Admit(n *LiveNode) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.nodes[n.ID]; ok {
		return &domain.Error{Code: domain.CodeDuplicateConn}
	}
	n.runs = map[string]int{}
	r.nodes[n.ID] = n
	delete(r.gone, n.ID)
	return nil
}

// departure is when and why a node last left this edge.
type departure struct {
	at     time.Time
	reason string
}

// Remove drops the node id if it is still served by link; it reports
// whether it did, so a stale disconnect never evicts a newer connection.
func (r *Registry) Remove(id string, link ports.NodeLink) bool {
	return r.leave(id, link, "")
}

// leave is Remove noting why the link ended.
func (r *Registry) leave(id string, link ports.NodeLink, reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.nodes[id]; ok && n.Link == link {
		delete(r.nodes, id)
		if n.draining {
			r.draining--
		}
		r.gone[id] = departure{at: time.Now(), reason: reason}
		return true
	}
	return false
}

// MarkDraining records that node id, while still served by link, is
// stopping: it admits no new run, so none is sent to it (PickForTarget),
// while its runs in flight go on and their events still arrive. It
// reports whether the mark is new.
func (r *Registry) MarkDraining(id string, link ports.NodeLink) bool {
	return r.markDraining(id, link, false)
}

// MarkStopping is MarkDraining on the node's own word that it stops (its
// node_draining, or a run it refused with shutting_down): the end of its
// link is then reported as the stop it is (Stopping). A node already
// draining (a reload's mark) is marked stopping all the same, and false is
// returned as the drain mark is not new.
func (r *Registry) MarkStopping(id string, link ports.NodeLink) bool {
	return r.markDraining(id, link, true)
}

// markDraining marks node id, while served by link, draining and, with
// stopping, stopping, under one lock: stopping always implies draining, so
// no reader sees a node stopping that still takes runs. It reports whether
// the drain mark is new.
func (r *Registry) markDraining(id string, link ports.NodeLink, stopping bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok || n.Link != link {
		return false
	}
	if stopping {
		n.stopping = true
	}
	if n.draining {
		return false
	}
	n.draining = true
	r.draining++
	return true
}

// Stopping reports whether node id, served by link, said it stops.
func (r *Registry) Stopping(id string, link ports.NodeLink) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	return ok && n.Link == link && n.stopping
}

// DisconnectedAt reports when node id last left this edge, and why, if it
// is not connected now and has been since the edge started.
func (r *Registry) DisconnectedAt(id string) (at time.Time, reason string, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.gone[id]
	return d.at, d.reason, ok
}

// SetConfig records the config a node now runs.
func (r *Registry) SetConfig(id string, link ports.NodeLink, cfg domain.NodeConfig) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if n, ok := r.nodes[id]; ok && n.Link == link {
		n.Config = cfg
	}
}

// Get returns a snapshot of node id.
func (r *Registry) Get(id string) (NodeView, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		return NodeView{}, false
	}
	return n.view(), true
}

// List returns snapshots of every live node, sorted by id.
func (r *Registry) List() []NodeView {
	return r.ListAs(domain.Anonymous())
}

// GetAs is Get for caller p: a node p may not see is not found.
func (r *Registry) GetAs(p domain.Principal, id string) (NodeView, bool) {
	if !p.SeesNode(id) {
		return NodeView{}, false
	}
	return r.Get(id)
}

// ListAs is List limited to the nodes caller p may see.
func (r *Registry) ListAs(p domain.Principal) []NodeView {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]NodeView, 0, len(r.nodes))
	for _, n := range r.nodes {
		if p.SeesNode(n.ID) {
			out = append(out, n.view())
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (n *LiveNode) view() NodeView {
	v := NodeView{ID: n.ID, Info: n.Info, Remote: n.Remote, ConnectedAt: n.ConnectedAt, Config: n.Config, Link: n.Link, TunnelsInFlight: n.tunnels, Draining: n.draining}
	listed := 0
	for _, a := range n.Config.Adapters {
		c := n.runs[a.Name]
		v.Adapters = append(v.Adapters, domain.AdapterStatus{Name: a.Name, Type: a.Type, MaxConcurrency: a.MaxConcurrency, InFlight: c})
		listed += c
	}
	v.RunsInFlight = n.inFlight()
	if listed != v.RunsInFlight {
		// Runs of an adapter a reload removed go on until they end.
		for name, c := range n.runs {
			if c > 0 && !n.hasAdapter(name) {
				v.RemovedAdapters = append(v.RemovedAdapters, domain.AdapterStatus{Name: name, InFlight: c})
			}
		}
		sort.Slice(v.RemovedAdapters, func(i, j int) bool { return v.RemovedAdapters[i].Name < v.RemovedAdapters[j].Name })
	}
	return v
}

func (n *LiveNode) hasAdapter(name string) bool {
	return slices.ContainsFunc(n.Config.Adapters, func(a domain.AdapterConfig) bool { return a.Name == name })
}

// offersTarget reports whether n's adapter serves target: any target
// (a model) for adapters other than exec, and for an exec adapter one of
// its targets ("" names none: every exec node refuses it alike).
func (n *LiveNode) offersTarget(adapter, target string) bool {
	for _, a := range n.Config.Adapters {
		if a.Name == adapter {
			if a.Type != domain.AdapterExec || target == "" {
				return true
			}
			_, ok := a.Targets[target]
			return ok
		}
	}
	return false
}

// freeSlots is how many more runs of adapter n admits by its config's
// max_concurrency (runs through this edge); unlimited (0) counts as plenty.
func (n *LiveNode) freeSlots(adapter string) int {
	for _, a := range n.Config.Adapters {
		if a.Name == adapter {
			if a.MaxConcurrency <= 0 {
				return math.MaxInt32
			}
			return a.MaxConcurrency - n.runs[adapter]
		}
	}
	return 0
}

// betterFor reports whether n is a better node than o for a run of
// adapter: one with a free slot of adapter beats one without (which would
// answer at_capacity); among those with a free slot, more free slots win;
// then, and among nodes all full (the run goes to one, whose at_capacity
// the caller then gets), fewer runs in flight, then the lower id.
func (n *LiveNode) betterFor(adapter string, o *LiveNode) bool {
	nf, of := n.freeSlots(adapter), o.freeSlots(adapter)
	if (nf > 0) != (of > 0) {
		return nf > 0
	}
	if nf > 0 && nf != of {
		return nf > of
	}
	if n.inFlight() != o.inFlight() {
		return n.inFlight() < o.inFlight()
	}
	return n.ID < o.ID
}

func (n *LiveNode) inFlight() int {
	t := 0
	for _, c := range n.runs {
		t += c
	}
	return t
}

// PickForTarget chooses the node, among those p may see (a node it may not
// see is not found), for a run of adapter's target and counts the run
// against it until release is called (release is idempotent).
//
// An explicit node must be connected and not draining (a draining one is
// shutting_down). Without one, draining nodes are left out as if they had
// already gone (they refuse every new run, and leave once their runs in
// flight end): a session run goes to
// the node that last admitted a run of its session (RememberSession) while
// that node is connected, visible to the caller and offers adapter, since
// the session's history lives in that node's store (and a second run of
// the session at once then meets the node's session_busy); otherwise a
// single connected node, none draining, is used as is (the spec's
// fallback; with others draining, the one left must offer adapter, or the
// run is no_node_available, as during a rolling restart); otherwise,
// among the nodes offering adapter, one with a free slot of adapter's
// max_concurrency wins over one without, then the most free slots, then
// the fewest runs in flight, ties broken by id (see betterFor). When every
// such node is full the run still goes to one, which answers at_capacity. A node chosen
// either way whose config lacks adapter is adapter_not_found here, before
// dispatch, as the node itself would answer: a run's adapter labels
// metrics (iop_runs_total), so a caller's string must never reach them.
// Without a node named or a session's node, a node whose adapter serves
// target (offersTarget) is picked before one whose adapter does not, which
// would answer target_not_found; when no node serves it, the run goes as
// it would with no target, so its node's answer names the targets it has.
func (r *Registry) PickForTarget(p domain.Principal, node, adapter, target, session string) (NodeView, func(), error) {
	return r.pickForRun(p, node, adapter, target, session, nil)
}

// errNoOtherNode: no node is left to try a refused run on (pickElsewhere).
var errNoOtherNode = errors.New("no other node to try the run on")

// pickElsewhere picks, as PickForTarget without a node named, the next node
// to try a run on that the nodes in tried refused: never one of them (a
// session's run, whose node is its session's, then has none), and after an
// at_capacity refusal (needFree) only a node with a free slot of adapter,
// as the edge counts them — a node as full as the one that refused would
// refuse alike — and only one whose adapter serves target (offersTarget):
// one that does not would turn the caller's at_capacity into
// target_not_found. errNoOtherNode if there is none.
func (r *Registry) pickElsewhere(p domain.Principal, adapter, target, session string, tried map[string]bool, needFree bool) (NodeView, func(), error) {
	return r.pickForRun(p, "", adapter, target, session, func(n *LiveNode) bool {
		return !tried[n.ID] && (!needFree || n.freeSlots(adapter) > 0) && n.offersTarget(adapter, target)
	})
}

// pickForRun is PickForTarget; with eligible set (a retry, no node named)
// it picks only a node eligible says may take the run, or answers
// errNoOtherNode.
func (r *Registry) pickForRun(p domain.Principal, node, adapter, target, session string, eligible func(*LiveNode) bool) (NodeView, func(), error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	visible := r.visible(p)
	var chosen, affine *LiveNode
	var open map[string]*LiveNode // visible less draining nodes
	if node == "" {
		open = r.taking(visible)
		affine = r.sessionNode(open, adapter, session)
	}
	switch {
	case node != "":
		n, ok := visible[node]
		if !ok {
			return NodeView{}, nil, domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", node)
		}
		if n.draining {
			return NodeView{}, nil, domain.Errorf(domain.CodeShuttingDown, "node %q is shutting down: it takes no new runs", node)
		}
		chosen = n
	case affine != nil:
		chosen = affine
	case len(visible) == 1 && len(open) == 1:
		for _, n := range open {
			chosen = n
		}
	default:
		var serves bool // chosen's adapter serves target
		for _, n := range open {
			if eligible != nil && !eligible(n) || !n.hasAdapter(adapter) {
				continue
			}
			// An exec adapter's targets are each node's own: one without
			// target would refuse the run however free it is.
			s := n.offersTarget(adapter, target)
			if chosen == nil || s && !serves || s == serves && n.betterFor(adapter, chosen) {
				chosen, serves = n, s
			}
		}
		if chosen == nil && eligible != nil {
			return NodeView{}, nil, errNoOtherNode
		}
		if chosen == nil {
			switch {
			case len(visible) == 0:
				return NodeView{}, nil, domain.Errorf(domain.CodeNoNodeAvailable, "no node is connected")
			case len(open) == 0:
				return NodeView{}, nil, domain.Errorf(domain.CodeNoNodeAvailable, "every connected node is shutting down")
			}
			for _, n := range visible {
				if n.draining && n.hasAdapter(adapter) {
					return NodeView{}, nil, domain.Errorf(domain.CodeNoNodeAvailable, "every connected node offering adapter %q is shutting down", adapter)
				}
			}
			return NodeView{}, nil, domain.Errorf(domain.CodeNoNodeAvailable, "no connected node offers adapter %q", adapter)
		}
	}
	if eligible != nil && !eligible(chosen) {
		// A session's node, or the only one, which refused already.
		return NodeView{}, nil, errNoOtherNode
	}
	if !chosen.hasAdapter(adapter) {
		have := make([]string, 0, len(chosen.Config.Adapters))
		for _, a := range chosen.Config.Adapters {
			have = append(have, a.Name)
		}
		list := strings.Join(have, ", ")
		if list == "" {
			list = "none"
		}
		return NodeView{}, nil, domain.Errorf(domain.CodeAdapterNotFound, "adapter %q is not configured on node %q (have: %s)", adapter, chosen.ID, list)
	}
	chosen.runs[adapter]++
	var once sync.Once
	release := func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if chosen.runs[adapter]--; chosen.runs[adapter] <= 0 {
				delete(chosen.runs, adapter)
			}
		})
	}
	return chosen.view(), release, nil
}

// holdRun counts a run of adapter that the edge does not follow against
// node id while id is still served by link, until the returned release is
// called (release is idempotent). It is for a run its node reports still
// going though no dispatch here holds its slot — a background run that
// outlived its link, or one from before the edge restarted — so the
// edge's in-flight counts, and the choice of node by free slots, match what
// the node itself admits against. False if id is not served by link.
func (r *Registry) holdRun(id string, link ports.NodeLink, adapter string) (func(), bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok || n.Link != link {
		return nil, false
	}
	n.runs[adapter]++
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if n.runs[adapter]--; n.runs[adapter] <= 0 {
				delete(n.runs, adapter)
			}
		})
	}, true
}

// taking is visible less the draining nodes: those a run may be sent to
// without naming one. visible itself while no node drains; call with mu
// held.
func (r *Registry) taking(visible map[string]*LiveNode) map[string]*LiveNode {
	if r.draining == 0 {
		return visible
	}
	out := make(map[string]*LiveNode, len(visible))
	for id, n := range visible {
		if !n.draining {
			out[id] = n
		}
	}
	return out
}

// sessionNode is the visible node session of adapter is bound to, if it
// offers adapter; call with mu held.
func (r *Registry) sessionNode(visible map[string]*LiveNode, adapter, session string) *LiveNode {
	if session == "" {
		return nil
	}
	id, ok := r.sessions.get(sessionKey{adapter, session})
	if !ok {
		return nil
	}
	if n, ok := visible[id]; ok && n.hasAdapter(adapter) {
		return n
	}
	return nil
}

// acquireTunnel counts a tunnel against node id until the returned release
// is called (release is idempotent); false if the node is not connected.
func (r *Registry) acquireTunnel(id string) (func(), bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[id]
	if !ok {
		return nil, false
	}
	n.tunnels++
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			n.tunnels--
			r.mu.Unlock()
		})
	}, true
}

// visible is the live nodes p may see; call with mu held.
func (r *Registry) visible(p domain.Principal) map[string]*LiveNode {
	if !p.Limited() {
		return r.nodes
	}
	out := make(map[string]*LiveNode, len(p.Nodes))
	for _, id := range p.Nodes {
		if n, ok := r.nodes[id]; ok {
			out[id] = n
		}
	}
	return out
}

// resolve finds an explicit node, or the only connected one when none is
// named, among the nodes caller p may see.
func (r *Registry) resolve(p domain.Principal, node string) (NodeView, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	visible := r.visible(p)
	if node != "" {
		n, ok := visible[node]
		if !ok {
			return NodeView{}, domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", node)
		}
		return n.view(), nil
	}
	switch len(visible) {
	case 0:
		return NodeView{}, domain.Errorf(domain.CodeNoNodeAvailable, "no node is connected")
	case 1:
		for _, n := range visible {
			return n.view(), nil
		}
	}
	return NodeView{}, domain.Errorf(domain.CodeInvalidRequest, "%d nodes are connected: name one", len(visible))
}
