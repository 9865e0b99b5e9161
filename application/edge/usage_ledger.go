package edge

import (
	"sort"
	"strings"
	"sync"

	"iop/domain"
	"iop/domain/nodecmd"
)

// UsageLine is the usage of provider tunnels summed for one node, caller
// key, provider and model: the contract's type, as it is part of the API
// (GET /v1/usage, usage_status "tunnels").
type UsageLine = nodecmd.TunnelUsage

type usageKey struct{ node, key, provider, model string }

// Bounds of the ledger: the model is what callers asked for, any string
// when a provider's model list is unknown, so neither the number of lines
// nor the length of a name may grow with what callers invent.
const (
	// MaxUsageLines is how many node/provider/model lines the ledger keeps;
	// tunnels of further models are summed in their node and provider's
	// OtherModels line.
	MaxUsageLines = 4096
	// OtherModels is the model of the line that sums models over the limit.
	OtherModels = "(other)"
	// maxModelName is the longest model name kept, in bytes.
	maxModelName = 256
)

// UsageLedger sums provider tunnel usage per node, provider and model, for
// usage_status. It lives in memory and starts empty with the edge. It is
// safe for concurrent use.
type UsageLedger struct {
	mu    sync.Mutex
	lines map[usageKey]*UsageLine
}

// NewUsageLedger returns an empty ledger.
func NewUsageLedger() *UsageLedger { return &UsageLedger{lines: map[usageKey]*UsageLine{}} }

// Record adds one finished tunnel of node to the ledger. The model is the
// one the caller asked for, or, when it named none, the one the provider
// reported in its usage.
func (l *UsageLedger) Record(node string, s domain.TunnelSummary) {
	model := s.Model
	if model == "" && s.Usage != nil {
		model = s.Usage.Model
	}
	if len(model) > maxModelName {
		model = strings.ToValidUTF8(model[:maxModelName], "")
	}
	k := usageKey{node, s.Key, s.Provider, model}
	l.mu.Lock()
	defer l.mu.Unlock()
	line := l.lines[k]
	if line == nil && len(l.lines) >= MaxUsageLines {
		k.model = OtherModels
		line = l.lines[k]
	}
	if line == nil {
		line = &UsageLine{Node: node, Key: s.Key, Provider: s.Provider, Model: k.model}
		l.lines[k] = line
	}
	line.Requests++
	if s.Error != "" {
		line.Errors++
	}
	line.BodyBytes += s.BodyBytes
	if s.Usage != nil {
		// A provider's counts within the bounds the history keeps them in,
		// and the sums saturating: two reports near the int64 maximum
		// wrapped a line negative.
		u := s.Usage.Bounded()
		line.PromptTokens = domain.AddTokens(line.PromptTokens, u.PromptTokens)
		line.CompletionTokens = domain.AddTokens(line.CompletionTokens, u.CompletionTokens)
		line.TotalTokens = domain.AddTokens(line.TotalTokens, u.Total())
	}
}

// Snapshot returns a copy of every line, sorted by node, provider, model and key.
func (l *UsageLedger) Snapshot() []UsageLine {
	l.mu.Lock()
	out := make([]UsageLine, 0, len(l.lines))
	for _, line := range l.lines {
		out = append(out, *line)
	}
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		if a.Provider != b.Provider {
			return a.Provider < b.Provider
		}
		if a.Model != b.Model {
			return a.Model < b.Model
		}
		return a.Key < b.Key
	})
	return out
}

// ForNode returns the lines of node (every line when node is empty), in
// Snapshot's order; never nil.
func (l *UsageLedger) ForNode(node string) []UsageLine {
	out := []UsageLine{}
	for _, line := range l.Snapshot() {
		if node == "" || line.Node == node {
			out = append(out, line)
		}
	}
	return out
}
