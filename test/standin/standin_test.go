package standin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"iop/test/standin"
	"iop/test/standin/anthropic"
	"iop/test/standin/gemini"
	"iop/test/standin/responses"
)

// sse reads a response's server-sent events: (event name, data) pairs.
func sse(t *testing.T, resp *http.Response) (names []string, datas []map[string]any) {
	t.Helper()
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var m map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil {
				t.Fatalf("data %q: %v", line, err)
			}
			names, datas = append(names, name), append(datas, m)
			name = ""
		}
	}
	return names, datas
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func get(m any, path ...string) any {
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[p]
	}
	return m
}

var full = standin.Reply{
	Text: "Hello, wörld!", Thinking: "Hmm, think.",
	Tool:  &standin.ToolCall{ID: "t1", Name: "Bash", Input: json.RawMessage(`{"command":"echo hi"}`)},
	Usage: standin.Usage{Input: 100, Output: 20, CacheRead: 5, CacheWrite: 3, Reasoning: 4},
}

func TestAnthropicStreamsEveryBlockAndRecordsRequests(t *testing.T) {
	t.Parallel()
	s := anthropic.Start(t)
	s.Reply(full)
	head, err := http.Head(s.URL + "/")
	if err != nil || head.StatusCode != 200 {
		t.Fatalf("HEAD / = %v %v", head, err)
	}
	names, datas := sse(t, post(t, context.Background(), s.URL+"/v1/messages?beta=true", `{"model":"claude-x","stream":true,"messages":[{"role":"user","content":"hi there"}]}`))
	var text, thinking, args strings.Builder
	var blocks []string
	for i, d := range datas {
		if d["type"] != names[i] {
			t.Errorf("event %q carries type %v", names[i], d["type"])
		}
		switch names[i] {
		case "content_block_start":
			blocks = append(blocks, get(d, "content_block", "type").(string))
		case "content_block_delta":
			text.WriteString(str(get(d, "delta", "text")))
			thinking.WriteString(str(get(d, "delta", "thinking")))
			args.WriteString(str(get(d, "delta", "partial_json")))
		}
	}
	if names[0] != "message_start" || names[len(names)-1] != "message_stop" || names[len(names)-2] != "message_delta" {
		t.Errorf("events = %v", names)
	}
	if get(datas[0], "message", "model") != "claude-x" || get(datas[0], "message", "usage", "input_tokens") != 100.0 || get(datas[0], "message", "usage", "cache_read_input_tokens") != 5.0 {
		t.Errorf("message_start = %v", datas[0])
	}
	md := datas[len(datas)-2]
	if get(md, "usage", "output_tokens") != 20.0 || get(md, "delta", "stop_reason") != "tool_use" {
		t.Errorf("message_delta = %v", md)
	}
	if text.String() != full.Text || thinking.String() != full.Thinking || args.String() != string(full.Tool.Input) || strings.Join(blocks, ",") != "thinking,text,tool_use" {
		t.Errorf("text %q thinking %q args %q blocks %v", text.String(), thinking.String(), args.String(), blocks)
	}
	msgs := s.Messages()
	if len(msgs) != 1 || msgs[0].Query != "beta=true" || anthropic.Text(msgs[0]) != "hi there" {
		t.Errorf("recorded = %+v", msgs)
	}
	if n := len(s.Requests()); n != 2 {
		t.Errorf("%d requests recorded, want HEAD and POST", n)
	}
}

func TestAnthropicWholeMessageAndFailure(t *testing.T) {
	t.Parallel()
	s := anthropic.Start(t)
	s.Queue(standin.Reply{Text: "whole", Usage: standin.Usage{Input: 3, Output: 2}}, standin.Reply{Status: 400, Error: "prompt is too long"})
	resp := post(t, context.Background(), s.URL+"/v1/messages", `{"model":"m","messages":[]}`)
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if m["type"] != "message" || get(m, "usage", "output_tokens") != 2.0 || m["stop_reason"] != "end_turn" {
		t.Errorf("message = %v", m)
	}
	if c, _ := m["content"].([]any); len(c) != 1 || get(c[0], "text") != "whole" {
		t.Errorf("content = %v", m["content"])
	}
	resp = post(t, context.Background(), s.URL+"/v1/messages", `{"model":"m","stream":true,"messages":[]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"invalid_request_error"`) || !strings.Contains(string(b), "prompt is too long") {
		t.Errorf("failure = %d %s", resp.StatusCode, b)
	}
}

func TestResponsesStreamCarriesUsageOnCompleted(t *testing.T) {
	t.Parallel()
	s := responses.Start(t)
	s.Reply(full)
	names, datas := sse(t, post(t, context.Background(), s.URL+"/v1/responses", `{"model":"gpt-x","stream":true,"input":"hi"}`))
	var text, reasoning, args strings.Builder
	for i, d := range datas {
		if d["type"] != names[i] || d["sequence_number"] != float64(i) {
			t.Errorf("event %d %q = %v", i, names[i], d)
		}
		switch names[i] {
		case "response.output_text.delta":
			text.WriteString(d["delta"].(string))
		case "response.reasoning_summary_text.delta":
			reasoning.WriteString(d["delta"].(string))
		case "response.function_call_arguments.delta":
			args.WriteString(d["delta"].(string))
		}
	}
	if names[0] != "response.created" || names[len(names)-1] != "response.completed" {
		t.Errorf("events = %v", names)
	}
	last := datas[len(datas)-1]
	if get(last, "response", "usage", "input_tokens") != 105.0 || get(last, "response", "usage", "input_tokens_details", "cached_tokens") != 5.0 || get(last, "response", "usage", "output_tokens") != 20.0 || get(last, "response", "model") != "gpt-x" {
		t.Errorf("completed = %v", last)
	}
	if text.String() != full.Text || reasoning.String() != full.Thinking || args.String() != string(full.Tool.Input) {
		t.Errorf("text %q reasoning %q args %q", text.String(), reasoning.String(), args.String())
	}
	if out, _ := get(last, "response", "output").([]any); len(out) != 3 || get(out[2], "call_id") != "t1" || get(out[2], "name") != "Bash" {
		t.Errorf("output = %v", out)
	}
}

func TestResponsesWholeAndFailure(t *testing.T) {
	t.Parallel()
	s := responses.Start(t)
	s.Script(func(n int, r standin.Request) standin.Reply {
		if n == 0 {
			return standin.Reply{Text: "whole"}
		}
		return standin.Reply{Status: 500, Error: "boom"}
	})
	resp := post(t, context.Background(), s.URL+"/v1/responses", `{"model":"m","input":"x"}`)
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if m["status"] != "completed" || get(m["output"].([]any)[0], "type") != "message" {
		t.Errorf("response = %v", m)
	}
	resp = post(t, context.Background(), s.URL+"/v1/responses", `{"model":"m","input":"x","stream":true}`)
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if resp.StatusCode != 500 || get(m, "error", "message") != "boom" {
		t.Errorf("failure = %d %v", resp.StatusCode, m)
	}
	if len(s.Responses()) != 2 || s.ModelRequests() != 2 {
		t.Errorf("recorded %d", len(s.Responses()))
	}
}

func TestGeminiRoutesJSONAndStreamsSSE(t *testing.T) {
	t.Parallel()
	s := gemini.Start(t)
	s.Reply(standin.Reply{Text: "Hello, wörld!", Thinking: "Hmm.", Usage: standin.Usage{Input: 10, Output: 6, Reasoning: 2}})
	resp := post(t, context.Background(), s.URL+"/v1beta/models/g-lite:generateContent", `{"contents":[{"role":"user","parts":[{"text":"route me"}]}],"generationConfig":{"responseMimeType":"application/json"}}`)
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	cand := m["candidates"].([]any)[0]
	var route map[string]any
	if err := json.Unmarshal([]byte(get(cand, "content", "parts").([]any)[0].(map[string]any)["text"].(string)), &route); err != nil || route["model_choice"] != "flash" {
		t.Errorf("routing answer = %v (%v)", m, err)
	}
	_, datas := sse(t, post(t, context.Background(), s.URL+"/v1beta/models/g-pro:streamGenerateContent?alt=sse", `{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`))
	var text, thought strings.Builder
	for _, d := range datas {
		for _, p := range get(d["candidates"].([]any)[0], "content", "parts").([]any) {
			if get(p, "thought") == true {
				thought.WriteString(str(get(p, "text")))
			} else {
				text.WriteString(str(get(p, "text")))
			}
		}
	}
	last := datas[len(datas)-1]
	if text.String() != "Hello, wörld!" || thought.String() != "Hmm." || get(last["candidates"].([]any)[0], "finishReason") != "STOP" || get(last, "usageMetadata", "promptTokenCount") != 10.0 || get(last, "usageMetadata", "thoughtsTokenCount") != 2.0 || get(last, "usageMetadata", "candidatesTokenCount") != 4.0 {
		t.Errorf("text %q thought %q last %v", text.String(), thought.String(), last)
	}
	calls, routing := s.Calls()
	if len(calls) != 2 || !routing[0] || routing[1] || s.ModelRequests() != 1 || gemini.Text(calls[1]) != "hi" {
		t.Errorf("calls %d routing %v model requests %d", len(calls), routing, s.ModelRequests())
	}
	s.Reply(standin.Reply{Status: 400, Error: "API key not valid"})
	resp = post(t, context.Background(), s.URL+"/v1beta/models/g:streamGenerateContent?alt=sse", `{"contents":[]}`)
	_ = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if resp.StatusCode != 400 || get(m, "error", "status") != "INVALID_ARGUMENT" {
		t.Errorf("failure = %d %v", resp.StatusCode, m)
	}
}

// A hanging reply sends its first piece and ends when the client goes.
func TestHangEndsWhenClientGoes(t *testing.T) {
	t.Parallel()
	s := anthropic.Start(t)
	s.Reply(standin.Reply{Text: "first and never the rest", Hang: true, Delay: time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	resp := post(t, ctx, s.URL+"/v1/messages", `{"model":"m","stream":true,"messages":[]}`)
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, "text_delta") {
			break
		}
	}
	cancel()
	resp.Body.Close()
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked on a hanging reply")
	}
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
