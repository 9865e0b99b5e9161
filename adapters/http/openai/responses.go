package openaiapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"iop/domain"
)

const (
	// maxResponseIDs bounds the remembered response ids; the oldest go first.
	maxResponseIDs = 10000
	// maxSniff bounds how much of a created response is searched for its id.
	maxSniff = 64 << 10
)

// responseFollowUp serves the Responses API's follow-ups (retrieve, delete,
// cancel, input items) at the node and provider that created the response:
// that provider holds its state. An id this edge does not remember is
// looked up in its history (responseOf); one neither knows goes to the
// pinned node (X-IOP-Node) or the only node with a provider of the OpenAI
// API, if there is just one; otherwise it is not found. A history that
// cannot be read refuses all but an admin key (503 history_unavailable),
// as whose the response is cannot be told. A response created on a node the caller may
// not see is answered as one this edge never saw: proxying there would
// fail naming the node, and a node outside a key's limit does not exist
// for that key. So is another key's response (an admin key may follow up
// any): its id can be seen by others (a follow-up's path on the event
// feed), and the provider would hand its content to whoever asks with the
// edge's provider key.
func (h *Handler) responseFollowUp(w http.ResponseWriter, r *http.Request, id string) {
	t := target{family: domain.ProviderOpenAI, followUp: id}
	p := domain.PrincipalFrom(r.Context())
	at, ok, err := h.responseOf(r.Context(), id)
	if err != nil && !p.Allows(domain.ScopeAdmin) {
		// Whose it is cannot be told: not another key's to risk.
		WriteError(w, r, statusFor(err), domain.CodeOf(err), domain.MessageOf(err))
		return
	}
	if ok {
		if !at.usableBy(p) {
			WriteError(w, r, http.StatusNotFound, "response_not_found", fmt.Sprintf("response %q was not created through this edge", id))
			return
		}
		if h.deps.Tunnels.Connected(at.node) {
			h.proxy(w, r, t, at.node, at.provider)
			return
		}
		// The caller's, created on a node not connected here (another
		// edge's, sharing the history; one gone since): routed as an id
		// the edge does not know.
	}
	if pinned := r.Header.Get(NodeHeader); pinned != "" {
		h.proxy(w, r, t, pinned, "")
		return
	}
	nodes := map[string]bool{}
	for _, p := range h.deps.Tunnels.Targets(p, domain.ProviderOpenAI) {
		nodes[p.Node] = true
	}
	if len(nodes) == 1 {
		for n := range nodes {
			h.proxy(w, r, t, n, "")
		}
		return
	}
	WriteError(w, r, http.StatusNotFound, "response_not_found",
		fmt.Sprintf("response %q was not created through this edge (or is too old to be remembered); pin its node with the X-IOP-Node header", id))
}

// responseOf is where response id was created: as this edge remembers
// it, or, for one it does not remember (it restarted, or forgot the id
// among 10,000 newer ones), as its history recalls it — remembered from
// then on, its usage counted if the history says a tunnel of it counted
// it or it is another edge's to count; else (a background response,
// queued when created) the first retrieval that reports its usage counts
// it, as for a response this edge remembers. ok is false when neither
// knows it; err, when the history could not be read.
func (h *Handler) responseOf(ctx context.Context, id string) (at responseAt, ok bool, err error) {
	if at, ok := h.responses.get(id); ok {
		return at, true, nil
	}
	o, found, err := h.deps.Tunnels.RecallResponse(ctx, id)
	if err != nil || !found {
		return responseAt{}, false, err
	}
	at = responseAt{node: o.Node, provider: o.Provider, key: o.Key, counted: o.Counted}
	if at.key == domain.AnonymousName {
		at.key = "" // created on an edge without keys: no key's
	}
	if !h.responses.put(id, at) {
		// Remembered meanwhile (a create, or another recall): as first seen.
		at, _ = h.responses.get(id)
	}
	return at, true, nil
}

// responseAt is where a response was created, and by which API key: ""
// for none (one the history recalls as created on an edge without keys,
// by its anonymous caller).
type responseAt struct {
	node, provider, key string
	// counted: a tunnel of this response counted its usage (the creation,
	// or the first retrieval of a background response that reported it).
	counted bool
}

// usableBy reports whether p may follow up the response: p sees its node,
// and it is p's own, no key's, or p has the admin scope (on an edge without
// keys every caller is the one anonymous admin).
func (a responseAt) usableBy(p domain.Principal) bool {
	return p.SeesNode(a.node) && a.ownedBy(p)
}

// ownedBy reports whether p may follow up or continue the response,
// wherever it was created: its key's, no key's, or an admin's.
func (a responseAt) ownedBy(p domain.Principal) bool {
	return a.key == p.Name || a.key == "" || p.Allows(domain.ScopeAdmin)
}

// responseNodes remembers which node and provider created a response, and
// for which key, up to max ids (first in, first out). An id is remembered
// as it was first seen: a node that answers with another response's id
// cannot take its follow-ups. Safe for concurrent use.
type responseNodes struct {
	mu    sync.Mutex
	max   int
	at    map[string]responseAt
	order []string // ring of ids in insertion order
	next  int
}

func newResponseNodes(max int) *responseNodes {
	return &responseNodes{max: max, at: make(map[string]responseAt, 64)}
}

// put remembers id as created at at, unless it is remembered already
// (reported false).
func (m *responseNodes) put(id string, at responseAt) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.at[id]; ok {
		return false
	}
	if len(m.order) < m.max {
		m.order = append(m.order, id)
	} else {
		delete(m.at, m.order[m.next])
		m.order[m.next] = id
		m.next = (m.next + 1) % m.max
	}
	m.at[id] = at
	return true
}

// countUsage reports whether the usage a tunnel of response id reports is
// to be counted, and from now on, it is not again: a response is
// retrieved as often as its client polls it, each time with its usage. An
// id not remembered is not counted (it may have been before a restart).
func (m *responseNodes) countUsage(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.at[id]
	if !ok || a.counted {
		return false
	}
	a.counted = true
	m.at[id] = a
	return true
}

func (m *responseNodes) get(id string) (responseAt, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a, ok := m.at[id]
	return a, ok
}

// idSniffer finds a created response's id in the first bytes of its body:
// the first "id" member, which is the response's own both in a JSON
// response object and in the SSE stream (response.created carries the
// response first). It holds at most maxSniff bytes.
type idSniffer struct {
	buf []byte
}

// feed adds body bytes; done reports that the search is over (id is ""
// when it gave up).
func (s *idSniffer) feed(p []byte) (id string, done bool) {
	s.buf = append(s.buf, p[:min(len(p), maxSniff-len(s.buf))]...)
	if id, ok := firstID(s.buf); ok {
		return id, true
	}
	return "", len(s.buf) >= maxSniff
}

// firstID finds `"id"` used as a key with a complete string value in b.
func firstID(b []byte) (string, bool) {
	pat := []byte(`"id"`)
	for off := 0; ; {
		i := bytes.Index(b[off:], pat)
		if i < 0 {
			return "", false
		}
		off += i + len(pat)
		rest := bytes.TrimLeft(b[off:], " \t\r\n")
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if len(rest) == 0 || rest[0] != '"' {
			continue
		}
		end := bytes.IndexByte(rest[1:], '"')
		if end < 0 {
			return "", false // the value is not all here yet
		}
		var id string
		if json.Unmarshal(rest[:end+2], &id) != nil || id == "" {
			continue
		}
		return id, true
	}
}
