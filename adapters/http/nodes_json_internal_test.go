package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"iop/application/edge"
)

// An offline node's entry says when and why it left; a connected one says
// neither, even if the registry still held an old reason.
func TestNodeEntryJSONCarriesTheDisconnectReason(t *testing.T) {
	left := time.Date(2026, 3, 1, 11, 50, 0, 0, time.UTC)
	why := "node refused its config v7: adapter \"llm\": ollama is not installed"
	off, err := json.Marshal(toNodeEntryJSON(edge.NodeEntry{View: edge.NodeView{ID: "n3"}, DisconnectedAt: left, DisconnectReason: why}))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(off, &m); err != nil || m["disconnect_reason"] != why || m["disconnected_at"] != "2026-03-01T11:50:00Z" {
		t.Fatalf("offline entry %s (%v)", off, err)
	}
	on, _ := json.Marshal(toNodeEntryJSON(edge.NodeEntry{View: edge.NodeView{ID: "n1", ConnectedAt: left}, Connected: true, DisconnectReason: why}))
	if strings.Contains(string(on), "disconnect") {
		t.Fatalf("connected entry %s", on)
	}
}

// A draining node says so; any other leaves the field out.
func TestNodeJSONSaysDraining(t *testing.T) {
	b, _ := json.Marshal(toNodeJSON(edge.NodeView{ID: "n1", Draining: true}))
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || m["draining"] != true {
		t.Fatalf("draining node %s (%v)", b, err)
	}
	if b, _ := json.Marshal(toNodeJSON(edge.NodeView{ID: "n1"})); strings.Contains(string(b), "draining") {
		t.Fatalf("node that is not draining: %s", b)
	}
}
