package openaiapi

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"iop/adapters/internal/requestid"
	"iop/application/edge"
	"iop/domain"
)

// root answers GET and HEAD / as Ollama does: the Ollama CLI probes it
// before every command, Claude Code before every session; both want 200.
func (h *Handler) root(w http.ResponseWriter, r *http.Request) {
	const text = "Ollama is running"
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Content-Length", "17")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = io.WriteString(w, text)
	}
}

// refreshCatalog waits, at most RefreshWait, for a catalog refresh that
// started now or later. A provider slow to list its models (one that is
// down and times out) then delays the answer by RefreshWait, not by the
// discovery timeout; the round goes on and serves the next request.
func (h *Handler) refreshCatalog(r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.RefreshWait)
	defer cancel()
	h.deps.Models.RefreshedSince(ctx, time.Now())
}

// listModels answers GET /v1/models in OpenAI's list shape: one entry per
// model and node (owned_by is the node id) of the providers that speak the
// OpenAI API. Asked by an Anthropic client
// (anthropic-version set), each entry also carries the Anthropic Models API
// fields (type, display_name, created_at) and the list its paging fields,
// and it lists the models of the providers that speak the Anthropic
// Messages API instead: each client sees the models it can use.
func (h *Handler) listModels(w http.ResponseWriter, r *http.Request) {
	anthropic := r.Header.Get("Anthropic-Version") != ""
	entries, err := h.models(r, anthropic)
	if err != nil {
		h.fail(w, r, err, nil, "")
		return
	}
	out := modelList{Object: "list", Data: []modelObject{}}
	seen := map[[2]string]bool{}
	for _, e := range entries {
		k := [2]string{e.ID, e.Node}
		if anthropic {
			k[1] = "" // Anthropic's list names each model once
		}
		if !seen[k] {
			seen[k] = true
			out.Data = append(out.Data, newModelObject(e, anthropic))
		}
	}
	if !anthropic {
		writeJSON(w, http.StatusOK, out)
		return
	}
	page, err := anthropicPage(out, r.URL.Query())
	if err != nil {
		h.fail(w, r, err, nil, "")
		return
	}
	requestid.Stamp(w.Header()) // every answer of Anthropic's API carries one
	writeJSON(w, http.StatusOK, page)
}

// anthropicPage is one page of list as the Anthropic Models API pages it:
// limit (default 20, 1 to 1000) entries after after_id, or before
// before_id (not both), with has_more, first_id and last_id.
func anthropicPage(list modelList, q url.Values) (anthropicModelList, error) {
	limit := 20
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return anthropicModelList{}, domain.Errorf(domain.CodeInvalidRequest, "limit: must be a whole number from 1 to 1000")
		}
		limit = n
	}
	if q.Get("after_id") != "" && q.Get("before_id") != "" {
		// Two cursors name no one page: answered with after_id's, the page
		// ran past limit (has_more was read as before_id's).
		return anthropicModelList{}, domain.Errorf(domain.CodeInvalidRequest, "after_id and before_id cannot both be set")
	}
	data := list.Data
	index := func(id string) int {
		return slices.IndexFunc(data, func(m modelObject) bool { return m.ID == id })
	}
	from, to := 0, len(data)
	switch after, before := q.Get("after_id"), q.Get("before_id"); {
	case after != "":
		from = index(after) + 1 // an id not listed: an empty page, not the first again
		if from == 0 {
			from = len(data)
		}
	case before != "":
		if to = index(before); to < 0 {
			to = 0
		}
		from = max(to-limit, 0)
	}
	more := false
	if q.Get("before_id") != "" {
		more = from > 0
	} else if to-from > limit {
		to, more = from+limit, true
	}
	page := anthropicModelList{modelList: modelList{Object: list.Object, Data: data[from:to]}, HasMore: more}
	if n := len(page.Data); n > 0 {
		page.FirstID, page.LastID = &page.Data[0].ID, &page.Data[n-1].ID
	}
	return page, nil
}

// getModel answers GET /v1/models/{model} with the first node serving it
// to the caller's API, as listModels lists them.
func (h *Handler) getModel(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/models/")
	anthropic := r.Header.Get("Anthropic-Version") != ""
	entries, err := h.models(r, anthropic)
	if err != nil {
		h.fail(w, r, err, nil, "")
		return
	}
	for _, exact := range []bool{true, false} {
		for _, e := range entries {
			if e.ID == id || (!exact && edge.MatchProviderModel(e.Type, e.ID, id)) {
				if anthropic {
					requestid.Stamp(w.Header())
				}
				writeJSON(w, http.StatusOK, newModelObject(e, anthropic))
				return
			}
		}
	}
	h.fail(w, r, domain.Errorf(domain.CodeModelNotFound, "the model %q does not exist", id), nil, id)
}

// models returns the catalog, refreshed if it was not just now, limited to
// the pinned node if there is one, to the nodes the caller's key may see
// and to the providers that answer the caller's API (the Anthropic Messages
// API for an Anthropic client, else OpenAI's): the models its requests can
// reach, as routing picks providers (an anthropic provider's model is no
// OpenAI model).
func (h *Handler) models(r *http.Request, anthropic bool) ([]edge.ModelEntry, error) {
	h.refreshCatalog(r)
	caller := domain.PrincipalFrom(r.Context())
	var all []edge.ModelEntry
	if node := r.Header.Get(NodeHeader); node != "" {
		if !caller.SeesNode(node) {
			return nil, domain.Errorf(domain.CodeNodeNotFound, "node %q is not connected", node)
		}
		var err error
		if all, err = h.deps.Models.NodeModels(node); err != nil {
			return nil, err
		}
	} else {
		all = visibleModels(caller, h.deps.Models.Models())
	}
	family := domain.ProviderOpenAI
	if anthropic {
		family = domain.ProviderAnthropic
	}
	out := make([]edge.ModelEntry, 0, len(all))
	for _, e := range all {
		if edge.Speaks(e.Type, family) {
			out = append(out, e)
		}
	}
	return out, nil
}

// visibleModels drops the models of nodes caller may not see.
func visibleModels(caller domain.Principal, all []edge.ModelEntry) []edge.ModelEntry {
	if !caller.Limited() {
		return all
	}
	out := make([]edge.ModelEntry, 0, len(all))
	for _, e := range all {
		if caller.SeesNode(e.Node) {
			out = append(out, e)
		}
	}
	return out
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Anthropic's Models API names, for Anthropic clients only.
	Type        string `json:"type,omitempty"`
	DisplayName string `json:"display_name,omitempty"`
	CreatedAt   string `json:"created_at,omitempty"`
}

func newModelObject(e edge.ModelEntry, anthropic bool) modelObject {
	m := modelObject{ID: e.ID, Object: "model", Created: e.Created, OwnedBy: e.Node}
	if anthropic {
		m.Type, m.DisplayName, m.CreatedAt = "model", e.ID, time.Unix(e.Created, 0).UTC().Format(time.RFC3339)
	}
	return m
}

type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

// anthropicModelList adds the Anthropic Models API's paging fields.
type anthropicModelList struct {
	modelList
	HasMore bool    `json:"has_more"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
}

// ollamaTag is the /api/tags entry the edge makes up for a model an ollama
// provider declares in config (its Ollama is not asked for a list). The
// Ollama CLI reads every field: `ollama list` prints digest[:12] (so an
// empty digest panics it), parses modified_at as a time and formats size
// as bytes.
type ollamaTag struct {
	Name       string   `json:"name"`
	Model      string   `json:"model"`
	ModifiedAt string   `json:"modified_at"`
	Size       int64    `json:"size"`
	Digest     string   `json:"digest"`
	Details    struct{} `json:"details"`
}

// tags answers GET /api/tags: pinned to a node, the node's own answer (see
// pinnedList); otherwise the ollama providers' models of every node (the
// catalog, refreshed if it was not just now) merged in Ollama's shape, one
// entry per model name.
func (h *Handler) tags(w http.ResponseWriter, r *http.Request) {
	if node := r.Header.Get(NodeHeader); node != "" {
		h.pinnedList(w, r, node, true)
		return
	}
	h.refreshCatalog(r)
	out := struct {
		Models []json.RawMessage `json:"models"`
	}{Models: []json.RawMessage{}}
	// at is where each name's entry is in out.Models; madeUp, whether that
	// entry is one the edge made up. A model some node's Ollama listed is
	// shown as listed (size, digest, details) even where another node only
	// declares it, whichever node sorts first.
	at := map[string]int{}
	madeUp := map[string]bool{}
	for _, e := range visibleModels(domain.PrincipalFrom(r.Context()), h.deps.Models.Models()) {
		if e.Type != domain.ProviderOllama {
			continue
		}
		name := e.ID
		if len(e.Raw) == 0 && !strings.Contains(name[strings.LastIndexByte(name, '/')+1:], ":") {
			// Ollama lists every model with its tag: a declared "llama3.2"
			// is "llama3.2:latest", the name clients look for here.
			name += ":latest"
		}
		i, seen := at[name]
		if seen && (!madeUp[name] || len(e.Raw) == 0) {
			continue
		}
		raw := json.RawMessage(e.Raw)
		if len(raw) == 0 {
			raw, _ = json.Marshal(ollamaTag{Name: name, Model: name, ModifiedAt: time.Unix(e.Created, 0).UTC().Format(time.RFC3339), Digest: placeholderDigest(e), Details: struct{}{}})
		}
		madeUp[name] = len(e.Raw) == 0
		if seen {
			out.Models[i] = raw // a listed entry in place of a made-up one
			continue
		}
		at[name] = len(out.Models)
		out.Models = append(out.Models, raw)
	}
	writeJSON(w, http.StatusOK, out)
}

// placeholderDigest stands in for the digest of a model no provider listed:
// 64 hex characters like Ollama's own (bare hex, no "sha256:"), so clients
// that slice or display it work, and stable for one node, provider and
// model, so the ID `ollama list` shows does not change between calls.
func placeholderDigest(e edge.ModelEntry) string {
	sum := sha256.Sum256([]byte(e.Node + "/" + e.Provider + "/" + e.ID))
	return hex.EncodeToString(sum[:])
}

// ps answers GET /api/ps: pinned to a node, the node's own answer (see
// pinnedList); otherwise every ollama provider of every node is asked and
// their "models" lists are concatenated (mergeLists).
func (h *Handler) ps(w http.ResponseWriter, r *http.Request) {
	if node := r.Header.Get(NodeHeader); node != "" {
		h.pinnedList(w, r, node, false)
		return
	}
	h.mergeLists(w, r, h.deps.Tunnels.Targets(domain.PrincipalFrom(r.Context()), domain.ProviderOllama), false)
}

// pinnedList answers GET /api/tags or /api/ps pinned to node with the
// node's own answer: that of its Ollama provider, byte for byte, or, when
// the node has several, each of them asked and their lists merged as
// mergeLists does (oneByName: one entry per model name, as the unpinned
// tags) — one provider's answer alone would leave the others' models out,
// which the unpinned lists show. A node the caller cannot reach (not
// connected, not visible to its key, stopping, without an Ollama provider)
// gets the refusal a pinned request gets.
func (h *Handler) pinnedList(w http.ResponseWriter, r *http.Request, node string, oneByName bool) {
	var mine []edge.ProviderTarget
	for _, t := range h.deps.Tunnels.Targets(domain.PrincipalFrom(r.Context()), domain.ProviderOllama) {
		if t.Node == node {
			mine = append(mine, t)
		}
	}
	if len(mine) <= 1 {
		h.proxy(w, r, target{family: domain.ProviderOllama}, "", "")
		return
	}
	h.mergeLists(w, r, mine, oneByName)
}

// mergeLists asks each of targets for r's list (GET /api/tags or /api/ps)
// and answers with their "models" lists concatenated, in targets' order;
// with oneByName, an entry whose name (else model) an earlier one had is
// left out. A provider that fails to answer is left out (and logged); if
// every one fails, the first failure is the answer.
func (h *Handler) mergeLists(w http.ResponseWriter, r *http.Request, targets []edge.ProviderTarget, oneByName bool) {
	parts := make([][]json.RawMessage, len(targets))
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(r.Context(), listTimeout)
			defer cancel()
			parts[i], errs[i] = h.askList(ctx, r, t)
		}()
	}
	wg.Wait()
	out := struct {
		Models []json.RawMessage `json:"models"`
	}{Models: []json.RawMessage{}}
	var firstErr error
	answered := 0
	seen := map[string]bool{}
	for i, p := range parts {
		if errs[i] != nil {
			h.log.Warn("provider left out of merged "+r.URL.Path, "node", targets[i].Node, "provider", targets[i].Provider, "err", errs[i])
			if firstErr == nil {
				firstErr = errs[i]
			}
			continue
		}
		answered++
		for _, m := range p {
			if oneByName {
				var id struct {
					Name  string `json:"name"`
					Model string `json:"model"`
				}
				_ = json.Unmarshal(m, &id)
				if name := cmp.Or(id.Name, id.Model); name != "" {
					if seen[name] {
						continue
					}
					seen[name] = true
				}
			}
			out.Models = append(out.Models, m)
		}
	}
	if answered == 0 && firstErr != nil {
		h.fail(w, r, firstErr, nil, "")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// askList makes r's GET at one provider and returns the "models" array of
// its answer.
func (h *Handler) askList(ctx context.Context, r *http.Request, t edge.ProviderTarget) ([]json.RawMessage, error) {
	tun, err := h.deps.Tunnels.Handle(ctx, edge.SubmitProviderTunnel{
		Node: t.Node, Provider: t.Provider, ProviderType: domain.ProviderOllama,
		Method: http.MethodGet, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery, Header: domain.Header{"Accept": {"application/json"}},
	})
	if err != nil {
		return nil, err
	}
	defer tun.Close()
	status := 0
	var body []byte
	for {
		f, err := tun.Next(ctx)
		if err != nil {
			return nil, err
		}
		switch f.Kind {
		case domain.TunnelStatus:
			status = f.Status
		case domain.TunnelBody:
			if len(body)+len(f.Body) > maxListBody {
				return nil, domain.Errorf(domain.CodeProviderError, "%s answer of node %s is larger than %d bytes", r.URL.Path, t.Node, maxListBody)
			}
			body = append(body, f.Body...)
		case domain.TunnelEnd:
			if status < 200 || status > 299 {
				return nil, domain.Errorf(domain.CodeProviderError, "%s on node %s answered %d", r.URL.Path, t.Node, status)
			}
			var doc struct {
				Models []json.RawMessage `json:"models"`
			}
			if err := json.Unmarshal(body, &doc); err != nil {
				return nil, domain.Errorf(domain.CodeProviderError, "%s on node %s: %v", r.URL.Path, t.Node, err)
			}
			return doc.Models, nil
		}
	}
}
