package e2e

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A provider that fails inside a 200 stream — Anthropic's overloaded_error
// after message_start, an OpenAI-compatible {"error":…} chunk, Ollama's
// final {"error":…} line — reaches its caller byte for byte, and the edge
// (real binaries: edge, node, stand-in providers) records each as a
// provider_error with status 200: the tunnel.completed event, the metrics'
// code label and /v1/usage's errors.
func TestErrorsInside200StreamsAreRecorded(t *testing.T) {
	streams := map[string]struct{ ct, body string }{
		"/v1/messages": {"text/event-stream",
			"event: message_start\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"usage":{"input_tokens":21,"output_tokens":1}}}` + "\n\n" +
				"event: error\n" + `data: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}` + "\n\n"},
		"/v1/chat/completions": {"text/event-stream",
			`data: {"id":"c1","object":"chat.completion.chunk","model":"m-sse","choices":[{"index":0,"delta":{"content":"Hi"}}]}` + "\n\n" +
				`data: {"error":{"message":"upstream timed out","type":"server_error","param":null,"code":null}}` + "\n\n"},
		"/api/chat": {"application/x-ndjson",
			`{"model":"llama3.2","message":{"role":"assistant","content":"Hi"},"done":false}` + "\n" +
				`{"error":"an error was encountered while running the model: unexpected EOF"}` + "\n"},
	}
	stand := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s, ok := streams[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", s.ct)
		w.WriteHeader(200)
		// One event per flush, as a provider sends them.
		for _, part := range strings.SplitAfter(s.body, "\n\n") {
			_, _ = io.WriteString(w, part)
			w.(http.Flusher).Flush()
		}
	}))
	t.Cleanup(stand.Close)
	e := startEdge(t, fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: ant, type: anthropic, base_url: %q, models: [claude-x]}
      - {name: oai, type: openai, base_url: %q, models: [m-sse]}
      - {name: oll, type: ollama, base_url: %q, models: ["llama3.2"]}
`, testToken, stand.URL, stand.URL, stand.URL))
	startNode(t, e, testToken)
	waitNode(t, e, "n1")
	bus := watchBus(t, e)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, c := range []struct{ path, body, provider, model, msg string }{
		{"/v1/messages", `{"model":"claude-x","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "ant", "claude-x", "overloaded_error: Overloaded"},
		{"/v1/chat/completions", `{"model":"m-sse","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "oai", "m-sse", "server_error: upstream timed out"},
		{"/api/chat", `{"model":"llama3.2","messages":[{"role":"user","content":"hi"}]}`, "oll", "llama3.2", "unexpected EOF"},
	} {
		resp := post(t, ctx, e.url+c.path, c.body, "Anthropic-Version", "2023-06-01")
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v", c.path, resp.StatusCode, err)
		}
		if want := streams[c.path].body; sha256.Sum256(got) != sha256.Sum256([]byte(want)) {
			t.Fatalf("%s: the caller got %q, want the provider's bytes %q", c.path, got, want)
		}
		bus.waitFor(t, 5*time.Second, "tunnel.completed of "+c.path+" with the provider's error", func(m map[string]any) bool {
			tn, _ := m["tunnel"].(map[string]any)
			msg, _ := tn["error"].(string)
			return m["type"] == "tunnel.completed" && tn["path"] == c.path && tn["status"] == float64(200) &&
				strings.HasPrefix(msg, "provider_error: ") && strings.Contains(msg, c.msg)
		})
		waitFor(t, c.path+" counted as provider_error", func() error {
			f := scrapeMetrics(t, e.url+"/metrics")
			labels := map[string]string{"node": "n1", "provider": c.provider, "model": c.model}
			if v := metricValue(f, "iop_tunnel_requests_total", withLabel(labels, "code", "provider_error")); v != 1 {
				return fmt.Errorf("iop_tunnel_requests_total%v{code=provider_error} = %v, want 1", labels, v)
			}
			if v := metricValue(f, "iop_tunnel_requests_total", withLabel(labels, "code", "200")); v != 0 {
				return fmt.Errorf("iop_tunnel_requests_total%v{code=200} = %v, want 0", labels, v)
			}
			return nil
		})
	}
	waitFor(t, "usage errors", func() error {
		var u usageResp
		if err := getJSON(e.url+"/v1/usage?group_by=node", &u); err != nil {
			return err
		}
		if len(u.Usage) != 1 || u.Usage[0].Tunnels != 3 || u.Usage[0].Errors != 3 || u.Usage[0].PromptTokens != 21 {
			return fmt.Errorf("usage by node %+v, want 3 tunnels, 3 errors and the 21 prompt tokens message_start stated", u.Usage)
		}
		return nil
	})
}

func withLabel(m map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for a, b := range m {
		out[a] = b
	}
	return out
}
