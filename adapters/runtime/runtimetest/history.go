package runtimetest

import (
	"encoding/json"
	"testing"
)

// ReplayedHistory reads a chat request's "messages" (as an adapter sent a
// session turn upstream) and returns them with the size in bytes of the
// history the turn replayed: all of them but the turn's own, the last.
func ReplayedHistory(t testing.TB, messages json.RawMessage) (sent []json.RawMessage, historyBytes int) {
	t.Helper()
	if err := json.Unmarshal(messages, &sent); err != nil {
		t.Fatal(err)
	}
	if len(sent) == 0 {
		t.Fatal("the request sent no messages")
	}
	for _, m := range sent[:len(sent)-1] {
		historyBytes += len(m)
	}
	return sent, historyBytes
}
