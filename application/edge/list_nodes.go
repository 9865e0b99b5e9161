package edge

import (
	"sort"
	"time"

	"iop/domain"
	"iop/ports"
)

// NodeEntry is one node of the edge's node list: a connected node, or one
// of the config that is not connected.
type NodeEntry struct {
	// View is the live node when Connected; otherwise only ID, Config
	// (adapters and providers of the config) and Adapters are set.
	View      NodeView
	Connected bool
	// DisconnectedAt is when an offline node last left this edge; zero
	// when it has not been connected since the edge started.
	DisconnectedAt time.Time
	// DisconnectReason is why it left then (the link's end, as the
	// node.disconnected bus event says it).
	DisconnectReason string
}

// ListNodesHandler lists the nodes the edge knows: every connected node and
// every node of the directory (edge.yaml nodes[]) that is not connected, so
// callers can tell an offline node from one that does not exist.
type ListNodesHandler struct {
	dir ports.NodeDirectory
	reg *Registry
}

// NewListNodesHandler returns the use case over dir and reg.
func NewListNodesHandler(dir ports.NodeDirectory, reg *Registry) *ListNodesHandler {
	return &ListNodesHandler{dir: dir, reg: reg}
}

// ListAs returns the nodes caller p may see, sorted by id. A node connected
// under an id no longer in the config (until reload drops it) is listed too.
func (h *ListNodesHandler) ListAs(p domain.Principal) []NodeEntry {
	live := h.reg.ListAs(p)
	out := make([]NodeEntry, 0, len(live))
	seen := make(map[string]bool, len(live))
	for _, v := range live {
		out = append(out, NodeEntry{View: v, Connected: true})
		seen[v.ID] = true
	}
	for _, rec := range h.dir.Records() {
		if seen[rec.ID] || !p.SeesNode(rec.ID) {
			continue
		}
		seen[rec.ID] = true
		e := NodeEntry{View: NodeView{ID: rec.ID, Config: domain.NodeConfig{Adapters: rec.Adapters, Providers: rec.Providers}}}
		for _, a := range rec.Adapters {
			limit := a.MaxConcurrency
			if limit == 0 {
				limit = domain.DefaultMaxConcurrency // what BuildConfig will push
			}
			e.View.Adapters = append(e.View.Adapters, domain.AdapterStatus{Name: a.Name, Type: a.Type, MaxConcurrency: limit})
		}
		// A node may connect between the two reads; the registry is the
		// truth for it, so ask again rather than report it offline.
		if v, ok := h.reg.GetAs(p, rec.ID); ok {
			e = NodeEntry{View: v, Connected: true}
		} else if t, why, ok := h.reg.DisconnectedAt(rec.ID); ok {
			e.DisconnectedAt, e.DisconnectReason = t, why
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].View.ID < out[j].View.ID })
	return out
}
