package node_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"iop/adapters/runtime/factory"
	"iop/adapters/runtime/ollama"
	"iop/adapters/store/memory"
	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

// A reload that renames (or removes) a chat adapter while a run of one of
// its sessions is in flight leaves that run going on the retired instance.
// Ending the session under the name the run was started with must still
// stop the run and forget what the session stored, as README promises
// ("ends a session on its node and cancels a run in flight in it"); it
// answered adapter_not_found, and the run went on and stored its turn.
func TestEndSessionOfAnAdapterARefreshRenamed(t *testing.T) {
	ucNoLeaks(t)
	var turns atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/chat" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		if turns.Add(1) == 1 {
			_, _ = w.Write([]byte(`{"message":{"role":"assistant","content":"first"},"done":false}` + "\n" +
				`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}` + "\n"))
			return
		}
		// The second turn streams a little, then waits for the caller.
		_, _ = w.Write([]byte(`{"message":{"role":"assistant","content":"partial"},"done":false}` + "\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()

	chats := memory.NewChatStore()
	f := factory.New(map[string]factory.Builder{
		domain.AdapterOllama: func(cfg domain.AdapterConfig) (ports.RuntimeAdapter, error) { return ollama.New(cfg, chats) },
	})
	rt := node.NewRuntime(f, nil)
	llm := func(name string) domain.AdapterConfig {
		return domain.AdapterConfig{Name: name, Type: domain.AdapterOllama, BaseURL: srv.URL, Models: []string{"m"}}
	}
	if err := rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 1, Adapters: []domain.AdapterConfig{llm("llm")}}); err != nil {
		t.Fatal(err)
	}
	runs := node.NewRunManager(rt, memory.NewRunStore(), nil)
	defer runs.Stop()
	start := func(id string) *ucOutput {
		out := newUCOutput()
		go runs.ExecuteRun(domain.RunRequest{RunID: id, Adapter: "llm", SessionID: "s1", Input: []byte("hi")}, out)
		return out
	}
	if term := ucCheckStream(t, "r1", start("r1").waitClosed(t)); term.Type != domain.EventComplete {
		t.Fatalf("first turn ended %s", ucTypes([]domain.RunEvent{term}))
	}
	if msgs, err := chats.LoadChat(context.Background(), "llm", "s1", 0); err != nil || len(msgs) == 0 {
		t.Fatalf("the first turn stored %d messages (%v)", len(msgs), err)
	}
	out := start("r2")
	out.wait(t, "the second turn to stream", func(evs []domain.RunEvent) bool {
		return len(evs) >= 2 && evs[1].Type == domain.EventDelta
	})

	// The reload renames the adapter; the run goes on under its old name.
	if err := rt.Apply(domain.NodeConfig{NodeID: "n1", Version: 2, Adapters: []domain.AdapterConfig{llm("chat")}}); err != nil {
		t.Fatal(err)
	}
	if err := node.NewSessionHandler(rt, runs).TerminateSession(context.Background(), "llm", "", "s1"); err != nil {
		t.Fatalf("ending the session of the run in flight: %v", err)
	}
	if term := ucCheckStream(t, "r2", out.waitClosed(t)); term.Type != domain.EventCancelled {
		t.Fatalf("the session's run ended %s, want cancelled", ucTypes([]domain.RunEvent{term}))
	}
	if msgs, err := chats.LoadChat(context.Background(), "llm", "s1", 0); err != nil || len(msgs) != 0 {
		t.Fatalf("the ended session still holds %d messages (%v)", len(msgs), err)
	}
	// Once the run is gone, the name is simply not configured.
	if err := node.NewSessionHandler(rt, runs).TerminateSession(context.Background(), "llm", "", "s1"); domain.CodeOf(err) != domain.CodeAdapterNotFound {
		t.Fatalf("ending it again = %v, want adapter_not_found", err)
	}
}
