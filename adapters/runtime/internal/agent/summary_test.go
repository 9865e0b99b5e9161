package agent_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"iop/adapters/runtime/internal/agent"
)

func TestTruncateKeepsRunesWhole(t *testing.T) {
	s := strings.Repeat("€", 1000) // 3 bytes each
	out, cut := agent.Truncate(s, 100)
	if !cut || !utf8.ValidString(out) || len(out) > 100+len("…") || !strings.HasSuffix(out, "…") {
		t.Errorf("Truncate = %q (%d bytes), cut %v", out, len(out), cut)
	}
	if out, cut := agent.Truncate("short", 100); out != "short" || cut {
		t.Errorf("short string changed: %q %v", out, cut)
	}
}

func TestShrinkJSON(t *testing.T) {
	small := json.RawMessage(`{"command":"ls <dir> & echo"}`)
	if got := agent.ShrinkJSON(small); string(got) != string(small) {
		t.Errorf("small JSON changed: %s", got)
	}
	big, _ := json.Marshal(map[string]any{"path": "/x", "n": 12345678901234567, "content": strings.Repeat("x", 10000), "list": []string{strings.Repeat("y", 5000)}})
	got := agent.ShrinkJSON(big)
	var v struct {
		Path    string
		N       json.Number
		Content string
		List    []string
	}
	if err := json.Unmarshal(got, &v); err != nil {
		t.Fatalf("%s: %v", got, err)
	}
	if v.Path != "/x" || v.N.String() != "12345678901234567" || len(v.Content) > agent.MaxSummary+3 || len(v.List[0]) > agent.MaxSummary+3 {
		t.Errorf("shrunk = %.300s", got)
	}
	huge, _ := json.Marshal(strings.Split(strings.Repeat("abc,", 10000), ","))
	if got := agent.ShrinkJSON(huge); len(got) > 2*agent.MaxSummary || got[0] != '"' {
		t.Errorf("huge JSON not reduced to a string: %d bytes", len(got))
	}
	if got := agent.ShrinkJSON(json.RawMessage(strings.Repeat("{", 5000))); got[0] != '"' {
		t.Errorf("invalid JSON = %.50s", got)
	}
}
