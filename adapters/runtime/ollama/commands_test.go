package ollama_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/adapters/runtime/ollama"
	"iop/domain"
)

// commandServer is a stand-in Ollama for the command family.
func commandServer(t *testing.T) *server {
	return newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "GET /api/version":
			_, _ = io.WriteString(w, `{"version":"0.5.1"}`)
		case "GET /api/tags":
			_, _ = io.WriteString(w, `{"models":[{"name":"qwen3:latest","model":"qwen3:latest","size":5225388164,"digest":"e4b5","details":{"family":"qwen3","parameter_size":"8.2B","quantization_level":"Q4_K_M"}}]}`)
		case "GET /api/ps":
			_, _ = io.WriteString(w, `{"models":[{"name":"qwen3:latest","size_vram":5000,"expires_at":"2025-01-01T00:05:00Z"}]}`)
		case "POST /api/show":
			_, _ = io.WriteString(w, `{"modelfile":"FROM x","capabilities":["completion","thinking"]}`)
		case "DELETE /api/delete":
			status(404, `{"error":"model 'gone' not found"}`)(w, r)
		case "POST /api/copy":
			w.WriteHeader(http.StatusOK)
		case "POST /api/pull":
			w.Header().Set("Content-Type", "application/x-ndjson")
			standin.Split(w, standin.Lines(pullLines...))
		default:
			http.NotFound(w, r)
		}
	})
}

var pullLines = []string{
	`{"status":"pulling manifest"}`,
	`{"status":"pulling e4b5","digest":"sha256:e4b5","total":2142590208,"completed":241970}`,
	`{"status":"pulling e4b5","digest":"sha256:e4b5","total":2142590208,"completed":2142590208}`,
	`{"status":"verifying sha256 digest"}`,
	`{"status":"writing manifest"}`,
	`{"status":"success"}`,
}

func command(t *testing.T, a *ollama.Adapter, name, args string) (string, error) {
	t.Helper()
	out, err := a.RunCommand(testContext(t), name, []byte(args), nil)
	return string(out), err
}

func TestQueryCommandsPassThrough(t *testing.T) {
	srv := commandServer(t)
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	for _, tc := range []struct{ name, args, want, request string }{
		{ollama.CmdVersion, "", `{"version":"0.5.1"}`, "GET /api/version"},
		{ollama.CmdList, `{"adapter":"llm"}`, `{"models":[{"name":"qwen3:latest","model":"qwen3:latest","size":5225388164,"digest":"e4b5","details":{"family":"qwen3","parameter_size":"8.2B","quantization_level":"Q4_K_M"}}]}`, "GET /api/tags"},
		{ollama.CmdPS, "null", `{"models":[{"name":"qwen3:latest","size_vram":5000,"expires_at":"2025-01-01T00:05:00Z"}]}`, "GET /api/ps"},
		{ollama.CmdShow, `{"model":"qwen3","adapter":"llm","verbose":true}`, `{"modelfile":"FROM x","capabilities":["completion","thinking"]}`, "POST /api/show"},
		{ollama.CmdCopy, `{"source":"qwen3","destination":"mine","provider":"ol"}`, `{"status":"success"}`, "POST /api/copy"},
	} {
		before := srv.Count()
		got, err := command(t, a, tc.name, tc.args)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%s = %s, want %s", tc.name, got, tc.want)
		}
		if p := pathOf(srv.Request(t, before)); p != tc.request {
			t.Errorf("%s sent %s, want %s", tc.name, p, tc.request)
		}
	}
	show := srv.Request(t, 3).Body
	if string(show["model"]) != `"qwen3"` || string(show["verbose"]) != "true" {
		t.Errorf("show body = %v", show)
	}
	if _, ok := show["adapter"]; ok {
		t.Error(`"adapter" reached Ollama`)
	}
	if cp := srv.Request(t, 4).Body; string(cp["destination"]) != `"mine"` || cp["provider"] != nil {
		t.Errorf(`copy body = %v: "provider" reached Ollama`, cp)
	}
}

func TestCommandArgumentErrors(t *testing.T) {
	srv := commandServer(t)
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	for _, tc := range []struct{ name, args string }{
		{ollama.CmdShow, ""},
		{ollama.CmdShow, `{"model":""}`},
		{ollama.CmdPull, `{"model":7}`},
		{ollama.CmdDelete, `[]`},
		{ollama.CmdCopy, `{"source":"a"}`},
		// No arguments but a selector: one that is not an object was
		// ignored, and the command answered.
		{ollama.CmdList, `5`},
		{ollama.CmdVersion, `[1]`},
		{ollama.CmdPS, `"x"`},
	} {
		if _, err := command(t, a, tc.name, tc.args); !errors.Is(err, domain.ErrInvalidRequest) {
			t.Errorf("%s %s: err = %v, want invalid_request", tc.name, tc.args, err)
		}
	}
	// A key of the wrong type is named so, not called missing.
	if _, err := command(t, a, ollama.CmdPull, `{"model":7}`); err == nil || !strings.Contains(err.Error(), `"model" must be a string, not a number`) {
		t.Errorf("pull {\"model\":7}: err = %v, want it to say model must be a string", err)
	}
	if _, err := command(t, a, "ollama.frobnicate", ""); !errors.Is(err, domain.ErrUnknownCommand) {
		t.Errorf("unknown command: err = %v", err)
	}
	if n := srv.Count(); n != 0 {
		t.Errorf("%d requests reached Ollama", n)
	}
}

func TestDeleteUnknownModel(t *testing.T) {
	srv := commandServer(t)
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	_, err := command(t, a, ollama.CmdDelete, `{"model":"gone"}`)
	if !errors.Is(err, domain.ErrModelNotFound) || domain.MessageOf(err) != "model 'gone' not found" {
		t.Fatalf("err = %v, want model_not_found with Ollama's message", err)
	}
	if p := pathOf(srv.Request(t, 0)); p != "DELETE /api/delete" {
		t.Errorf("request = %s", p)
	}
}

func TestPullProgressInOrder(t *testing.T) {
	srv := commandServer(t)
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	var got []string
	out, err := a.RunCommand(testContext(t), ollama.CmdPull, []byte(`{"model":"qwen3","stream":false}`), func(b []byte) error {
		got = append(got, string(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"status":"success"}` {
		t.Errorf("result = %s", out)
	}
	if strings.Join(got, "\n") != strings.Join(pullLines, "\n") {
		t.Errorf("progress =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(pullLines, "\n"))
	}
	if body := srv.Request(t, 0).Body; string(body["model"]) != `"qwen3"` || body["stream"] != nil {
		t.Errorf("pull body = %v (stream must be left to its streaming default)", body)
	}
}

func TestPullErrors(t *testing.T) {
	cases := []struct {
		name   string
		handle func(http.ResponseWriter, *http.Request)
		code   string
		msg    string
	}{
		{"error line", ndjson(standin.Lines(`{"status":"pulling manifest"}`, `{"error":"pull model manifest: file does not exist"}`)),
			domain.CodeProviderError, "pull model manifest: file does not exist"},
		{"registry unreachable", status(500, `{"error":"pull model manifest: Get \"https://registry.ollama.ai/v2/library/x/manifests/latest\": dial tcp: lookup registry.ollama.ai: no such host"}`),
			domain.CodeProviderError, "pull model manifest: Get \"https://registry.ollama.ai/v2/library/x/manifests/latest\": dial tcp: lookup registry.ollama.ai: no such host"},
		{"no success", ndjson(standin.Lines(`{"status":"pulling manifest"}`)), domain.CodeProviderError, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, tc.handle)
			a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
			var progress []string
			_, err := a.RunCommand(testContext(t), ollama.CmdPull, []byte(`{"model":"x"}`), func(b []byte) error {
				progress = append(progress, string(b))
				return nil
			})
			if domain.CodeOf(err) != tc.code {
				t.Fatalf("err = %v, want code %s", err, tc.code)
			}
			if tc.msg != "" && domain.MessageOf(err) != tc.msg {
				t.Errorf("message = %q, want %q", domain.MessageOf(err), tc.msg)
			}
			for _, p := range progress {
				if strings.Contains(p, "error") {
					t.Errorf("the error line went to progress: %s", p)
				}
			}
		})
	}
}

func TestPullStopsWhenTheCallerLeaves(t *testing.T) {
	gone := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"status":"pulling manifest"}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(gone)
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	errLeft := errors.New("caller left")
	_, err := a.RunCommand(testContext(t), ollama.CmdPull, []byte(`{"model":"x"}`), func([]byte) error { return errLeft })
	if !errors.Is(err, errLeft) {
		t.Fatalf("err = %v, want the progress callback's", err)
	}
	<-gone

	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	if _, err := a.RunCommand(ctx, ollama.CmdVersion, nil, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled command: err = %v", err)
	}
}

func TestCommandConnectRefused(t *testing.T) {
	a := newAdapter(t, domain.AdapterConfig{BaseURL: standin.RefusedURL(t)}, nil)
	if _, err := command(t, a, ollama.CmdList, ""); domain.CodeOf(err) != domain.CodeProviderUnreachable {
		t.Fatalf("err = %v, want provider_unreachable", err)
	}
}

func pathOf(r standin.Request) string { return r.Method + " " + r.Path }

// An Ollama declared as a provider may have a base_url with a query (a
// proxy's token), which its tunnels keep after the path; its commands and
// chats keep it too, instead of sending the path inside the query.
func TestBaseURLQueryFollowsThePath(t *testing.T) {
	seen := make(chan string, 4)
	srv := standin.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Method + " " + r.URL.Path + "?" + r.URL.RawQuery
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"models":[]}`)
	})
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL + "/?token=abc"}, nil)
	if got, err := command(t, a, ollama.CmdList, ""); err != nil || got != `{"models":[]}` {
		t.Fatalf("ollama.list = %s, %v", got, err)
	}
	if got := <-seen; got != "GET /api/tags?token=abc" {
		t.Fatalf("request %q, want GET /api/tags?token=abc", got)
	}
}
