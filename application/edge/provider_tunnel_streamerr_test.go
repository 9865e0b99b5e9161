package edge_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"iop/application/edge"
	"iop/domain"
	"iop/ports"
)

// ptOutcomes records each finished tunnel's history row and metrics
// outcome.
type ptOutcomes struct {
	mu       sync.Mutex
	rows     []domain.TunnelRecord
	outcomes []ports.TunnelOutcome
}

func (o *ptOutcomes) RecordRun(domain.RunRecord) {}
func (o *ptOutcomes) RecordTunnel(r domain.TunnelRecord) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.rows = append(o.rows, r)
}
func (o *ptOutcomes) NodeRegistration(string)      {}
func (o *ptOutcomes) RunFinished(ports.RunOutcome) {}
func (o *ptOutcomes) RunDispatched(string, string) {}
func (o *ptOutcomes) HistoryDropped(int)           {}
func (o *ptOutcomes) TunnelFinished(out ports.TunnelOutcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes = append(o.outcomes, out)
}

// A provider that fails inside a 200 stream (Anthropic's overloaded_error
// after message_start) is relayed as it came — status, bytes, a clean end —
// and recorded as failed: the history's error code, the ledger's errors,
// the metrics' code and tunnel.completed all say provider_error, with the
// 200 kept as its status. A stream error the node reports for a non-2xx
// answer changes nothing: that answer is recorded by its status already.
func TestProviderTunnelRecordsAnErrorInsideA200Stream(t *testing.T) {
	e := newPTEnv()
	rec := &ptOutcomes{}
	e.h.Observe = edge.Observers{Metrics: rec, History: rec}
	start := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12}}}\n\n"
	failed := "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"
	status := 200
	ptAdmit(t, e.reg, "a", ptProvider("claude", domain.ProviderAnthropic, "claude-x")).open = func(domain.TunnelRequest) (ports.TunnelStream, error) {
		return newPTStream(nil,
			domain.TunnelFrame{Kind: domain.TunnelStatus, Status: status},
			domain.TunnelFrame{Kind: domain.TunnelHeader, Header: domain.Header{"Content-Type": {"text/event-stream"}}},
			domain.TunnelFrame{Kind: domain.TunnelBody, Body: []byte(start)},
			domain.TunnelFrame{Kind: domain.TunnelBody, Body: []byte(failed)},
			domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: &domain.Usage{PromptTokens: 12, TotalTokens: 12}},
			domain.TunnelFrame{Kind: domain.TunnelMetadata, StreamError: &domain.ProviderStreamError{Type: "overloaded_error", Message: "Overloaded"}},
			domain.TunnelFrame{Kind: domain.TunnelEnd},
		), nil
	}
	open := func() {
		t.Helper()
		tun, err := e.h.Handle(context.Background(), edge.SubmitProviderTunnel{Model: "claude-x", ProviderType: domain.ProviderAnthropic, Method: "POST", Path: "/v1/messages"})
		if err != nil {
			t.Fatal(err)
		}
		body, err := ptDrain(t, tun)
		if err != nil {
			t.Fatalf("a stream that ended cleanly reads as %v to its caller", err)
		}
		if body != start+failed {
			t.Fatalf("body = %q, want the provider's bytes", body)
		}
	}
	open()

	evs := e.bus.events()
	if len(evs) != 1 || evs[0].Tunnel == nil {
		t.Fatalf("events = %+v", evs)
	}
	s := *evs[0].Tunnel
	if s.Status != 200 || !strings.HasPrefix(s.Error, "provider_error: ") || !strings.Contains(s.Error, "overloaded_error: Overloaded") ||
		s.Usage == nil || s.Usage.PromptTokens != 12 {
		t.Fatalf("tunnel.completed = %+v, want status 200 with the provider's error and its usage", s)
	}
	if l := e.ledger.Snapshot(); len(l) != 1 || l[0].Requests != 1 || l[0].Errors != 1 || l[0].PromptTokens != 12 {
		t.Fatalf("ledger = %+v, want 1 request, 1 error", l)
	}
	rec.mu.Lock()
	if len(rec.rows) != 1 || rec.rows[0].Status != 200 || rec.rows[0].ErrorCode != domain.CodeProviderError {
		t.Fatalf("history rows = %+v, want status 200 and error code provider_error", rec.rows)
	}
	if len(rec.outcomes) != 1 || rec.outcomes[0].Code != domain.CodeProviderError {
		t.Fatalf("metrics outcomes = %+v, want code provider_error", rec.outcomes)
	}
	rec.mu.Unlock()

	status = 529
	open()
	if l := e.ledger.Snapshot(); len(l) != 1 || l[0].Requests != 2 || l[0].Errors != 1 {
		t.Fatalf("ledger = %+v, want the 529 counted by its status only", l)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if r := rec.rows[1]; r.Status != 529 || r.ErrorCode != "" || rec.outcomes[1].Code != "529" {
		t.Fatalf("history row %+v, metrics %+v: want the 529 as it was", r, rec.outcomes[1])
	}
}
