package node_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

// Metadata too large for one event is replaced by a marker; the run still
// completes instead of failing on a frame it cannot send.
func TestOversizedMetadataIsTruncatedNotFatal(t *testing.T) {
	ucNoLeaks(t)
	huge := []byte(`{"tool_use":{"input":"` + strings.Repeat("x", node.MaxEventMetadata) + `"}}`)
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
		"": ucEmit(nil, domain.RunEvent{Type: domain.EventMetadata, Metadata: huge}, ucComplete(nil)),
	})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	out := newUCOutput()
	n.runs.ExecuteRun(domain.RunRequest{RunID: "r1", Adapter: "a"}, out)
	evs := out.waitClosed(t)
	if len(evs) != 3 || evs[1].Type != domain.EventMetadata || evs[2].Type != domain.EventComplete {
		t.Fatalf("events = %s", ucTypes(evs))
	}
	want := `{"truncated":true,"bytes":` + itoa(len(huge)) + `}`
	if string(evs[1].Metadata) != want {
		t.Fatalf("metadata = %s, want %s", evs[1].Metadata, want)
	}
}

// No run is admitted once the node is stopping; the caller hears why.
func TestNoRunAdmittedAfterStop(t *testing.T) {
	ucNoLeaks(t)
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": ucEmit(nil, ucComplete(nil))})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	n.runs.Stop()
	out := newUCOutput()
	n.runs.ExecuteRun(domain.RunRequest{RunID: "r1", Adapter: "a"}, out)
	evs := out.waitClosed(t)
	if len(evs) != 1 || evs[0].Type != domain.EventError || evs[0].Error.Code != domain.CodeShuttingDown || len(a.ranRuns()) != 0 {
		t.Fatalf("events = %+v, adapter ran %v", evs, a.ranRuns())
	}
	if _, err := n.store.GetRun(context.Background(), "r1"); err == nil {
		t.Fatal("a refused run must not be recorded as started")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
