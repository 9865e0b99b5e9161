package edge_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// usage_status answers with the node's run counts plus the edge's own
// tunnel usage for that node only; other commands are untouched.
func TestUsageStatusCarriesTheEdgesTunnelUsage(t *testing.T) {
	e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}}, ucNodeSpec{"b", []string{"exec"}})
	node := `{"adapters":[{"adapter":"exec","runs_total":2}]}`
	for _, id := range []string{"a", "b"} {
		e.links[id].commands = map[string][]ports.CommandReply{
			"usage_status": {{Final: true, Result: []byte(node)}},
			"capabilities": {{Final: true, Result: []byte(`{"node_id":"x"}`)}},
		}
	}
	ledger := edge.NewUsageLedger()
	ledger.Record("a", domain.TunnelSummary{Provider: "p", Model: "m", Status: 200, BodyBytes: 10, Duration: time.Millisecond,
		Usage: &domain.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}})
	ledger.Record("b", domain.TunnelSummary{Provider: "q", Model: "m", Status: 200})
	h := edge.NewNodeCommandHandler(e.reg)
	h.Ledger = ledger

	out, err := h.Call(context.Background(), "a", "usage_status", nil)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Adapters []map[string]any `json:"adapters"`
		Tunnels  []edge.UsageLine `json:"tunnels"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if len(got.Adapters) != 1 || len(got.Tunnels) != 1 {
		t.Fatalf("usage_status = %s", out)
	}
	if l := got.Tunnels[0]; l.Node != "a" || l.Provider != "p" || l.Requests != 1 || l.PromptTokens != 3 || l.CompletionTokens != 4 || l.BodyBytes != 10 {
		t.Fatalf("tunnel line = %+v", l)
	}
	if out, err := h.Call(context.Background(), "a", "capabilities", nil); err != nil || string(out) != `{"node_id":"x"}` {
		t.Fatalf("capabilities changed: %s %v", out, err)
	}
}

// A usage_status result that is not the contract's object reaches the
// caller as the node sent it.
func TestUsageStatusPassesOnAForeignResult(t *testing.T) {
	for _, res := range []string{`null`, `[1,2]`, `"busy"`} {
		e := newUCEdge(t, ucNodeSpec{"a", []string{"exec"}})
		e.links["a"].commands = map[string][]ports.CommandReply{"usage_status": {{Final: true, Result: []byte(res)}}}
		h := edge.NewNodeCommandHandler(e.reg)
		h.Ledger = edge.NewUsageLedger()
		out, err := h.Call(context.Background(), "a", "usage_status", nil)
		if err != nil || string(out) != res {
			t.Fatalf("usage_status %s = %s %v", res, out, err)
		}
	}
}
