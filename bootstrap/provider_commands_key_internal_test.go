package bootstrap

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"iop/adapters/runtime/factory"
	"iop/adapters/store/memory"
	nodeapp "iop/application/node"
	"iop/domain"
)

// An Ollama declared as a provider with api_key_env (behind an
// authenticating proxy, or ollama.com) gets the key on its tunnels; its
// ollama.* commands went without it and were answered 401. They send it
// now, read from the node's environment at each request, so a refresh
// that names another variable takes effect for the next command.
func TestProviderOllamaCommandsSendTheProvidersKey(t *testing.T) {
	t.Setenv("IOP_TEST_OLLAMA_KEY_A", "key-a")
	t.Setenv("IOP_TEST_OLLAMA_KEY_B", "key-b")
	want := "Bearer key-a"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("Authorization"); got != want {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"unauthorized: got ` + got + `"}`))
			return
		}
		switch r.URL.Path {
		case "/api/tags":
			_, _ = w.Write([]byte(`{"models":[{"name":"m:latest"}]}`))
		case "/api/pull":
			_, _ = w.Write([]byte(`{"status":"pulling manifest"}` + "\n" + `{"status":"success"}` + "\n"))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()

	rt := nodeapp.NewRuntime(factory.New(nil), nil).WithProviderCommands(providerCommands{})
	apply := func(version uint64, env string) {
		t.Helper()
		err := rt.Apply(domain.NodeConfig{NodeID: "n1", Version: version, Providers: []domain.ProviderConfig{
			{Name: "ol", Type: domain.ProviderOllama, BaseURL: srv.URL, APIKeyEnv: env},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	apply(1, "IOP_TEST_OLLAMA_KEY_A")
	store := memory.NewRunStore()
	rm := nodeapp.NewRunManager(rt, store, nil)
	defer rm.Stop()
	h := nodeapp.NewCommandHandler(rt, rm, nodeapp.NewSessionHandler(rt, rm), store, "test")
	ctx := context.Background()

	got, err := h.RunCommand(ctx, "ollama.list", []byte(`{"provider":"ol"}`), nil)
	if err != nil {
		t.Fatalf("ollama.list: %v", err)
	}
	if !json.Valid(got) || string(got) != `{"models":[{"name":"m:latest"}]}` {
		t.Fatalf("ollama.list answered %s", got)
	}
	var progress int
	if _, err := h.RunCommand(ctx, "ollama.pull", []byte(`{"provider":"ol","model":"m"}`), func([]byte) error { progress++; return nil }); err != nil {
		t.Fatalf("ollama.pull: %v", err)
	}
	if progress == 0 {
		t.Fatal("ollama.pull reported no progress")
	}

	// A refresh naming another variable: the next command sends its value.
	want = "Bearer key-b"
	apply(2, "IOP_TEST_OLLAMA_KEY_B")
	if _, err := h.RunCommand(ctx, "ollama.list", nil, nil); err != nil {
		t.Fatalf("ollama.list after the refresh: %v", err)
	}
}
