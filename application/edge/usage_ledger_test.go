package edge_test

import (
	"math"
	"sync"
	"testing"

	"iop/application/edge"
	"iop/domain"
)

func TestUsageLedger(t *testing.T) {
	l := edge.NewUsageLedger()
	if s := l.Snapshot(); len(s) != 0 {
		t.Fatalf("new ledger = %+v", s)
	}
	l.Record("b", domain.TunnelSummary{Provider: "p", Model: "m", BodyBytes: 10, Usage: &domain.Usage{PromptTokens: 3, CompletionTokens: 4}})
	l.Record("a", domain.TunnelSummary{Provider: "q", Model: "m", BodyBytes: 1, Error: "provider_error: reset"})
	l.Record("b", domain.TunnelSummary{Provider: "p", Model: "m", BodyBytes: 5, Usage: &domain.Usage{PromptTokens: 1, CompletionTokens: 1, TotalTokens: 9}})
	// No requested model: the provider's reported one is used.
	l.Record("a", domain.TunnelSummary{Provider: "q", BodyBytes: 2, Usage: &domain.Usage{TotalTokens: 2, Model: "reported"}})
	l.Record("a", domain.TunnelSummary{Provider: "q", BodyBytes: 3})

	want := []edge.UsageLine{
		{Node: "a", Provider: "q", Model: "", Requests: 1, BodyBytes: 3},
		{Node: "a", Provider: "q", Model: "m", Requests: 1, Errors: 1, BodyBytes: 1},
		{Node: "a", Provider: "q", Model: "reported", Requests: 1, TotalTokens: 2, BodyBytes: 2},
		{Node: "b", Provider: "p", Model: "m", Requests: 2, PromptTokens: 4, CompletionTokens: 5, TotalTokens: 16, BodyBytes: 15},
	}
	got := l.Snapshot()
	if len(got) != len(want) {
		t.Fatalf("snapshot = %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("line %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	got[0].Requests = 99
	if l.Snapshot()[0].Requests != 1 {
		t.Fatal("snapshot shares memory with the ledger")
	}
}

func TestUsageLedgerConcurrent(t *testing.T) {
	l := edge.NewUsageLedger()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				l.Record("n", domain.TunnelSummary{Provider: "p", Model: "m", BodyBytes: 1, Usage: &domain.Usage{TotalTokens: 1}})
				_ = l.Snapshot()
			}
		}()
	}
	wg.Wait()
	if s := l.Snapshot(); len(s) != 1 || s[0].Requests != 800 || s[0].TotalTokens != 800 || s[0].BodyBytes != 800 {
		t.Fatalf("snapshot = %+v", s)
	}
}

// The model is whatever the caller asked for (any string when a provider's
// model list is unknown): the ledger must not grow with every name a caller
// invents, nor keep huge names.
func TestUsageLedgerIsBounded(t *testing.T) {
	l := edge.NewUsageLedger()
	long := string(make([]byte, 1<<20))
	for i := range 3 * edge.MaxUsageLines {
		l.Record("n", domain.TunnelSummary{Provider: "p", Model: string(rune(i+1)) + long[:1000], BodyBytes: 1})
	}
	l.Record("n", domain.TunnelSummary{Provider: "p", Model: long, BodyBytes: 1})
	lines := l.Snapshot()
	if len(lines) > edge.MaxUsageLines+1 {
		t.Fatalf("%d ledger lines, want at most %d", len(lines), edge.MaxUsageLines+1)
	}
	var reqs int64
	for _, ln := range lines {
		if len(ln.Model) > 256 {
			t.Fatalf("a ledger line keeps a %d-byte model name", len(ln.Model))
		}
		reqs += ln.Requests
	}
	if reqs != int64(3*edge.MaxUsageLines+1) {
		t.Fatalf("%d requests counted, want %d", reqs, 3*edge.MaxUsageLines+1)
	}
}

// Providers reporting absurd counts: each is kept within the history's
// bounds (domain.Usage.Bounded), so the line's sums stay positive instead
// of wrapping past the int64 maximum.
func TestUsageLedgerBoundsAbsurdCounts(t *testing.T) {
	l := edge.NewUsageLedger()
	for range 2 {
		l.Record("n", domain.TunnelSummary{Provider: "p", Model: "m", Usage: &domain.Usage{PromptTokens: math.MaxInt64 - 7, CompletionTokens: -3}})
	}
	l.Record("n", domain.TunnelSummary{Provider: "p", Model: "m", Usage: &domain.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: math.MinInt64}})
	s := l.Snapshot()
	want := edge.UsageLine{Node: "n", Provider: "p", Model: "m", Requests: 3,
		PromptTokens: 2*domain.MaxUsageTokens + 1, CompletionTokens: 2, TotalTokens: 2*domain.MaxUsageTokens + 3}
	if len(s) != 1 || s[0] != want {
		t.Fatalf("snapshot = %+v, want %+v", s, want)
	}
}
