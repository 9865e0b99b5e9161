package openai_test

import (
	"strings"
	"testing"

	"iop/adapters/runtime/internal/standin"
	"iop/adapters/store/memory"
	"iop/domain"
)

// Mistral's reasoning models (Magistral) stream delta.content as an array
// of parts: "thinking" parts (their own text parts inside) and "text"
// parts. The thinking is reasoning, the text the answer; neither is lost,
// and a session stores the answer as text.
func TestContentPartsArray(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n",
		chunk(`{"role":"assistant","content":[{"type":"thinking","thinking":[{"type":"text","text":"Let "}]}]}`, ""),
		chunk(`{"content":[{"type":"thinking","thinking":[{"type":"text","text":"me think"}]}]}`, ""),
		chunk(`{"content":[{"type":"text","text":"Hel"}]}`, ""),
		chunk(`{"content":"lo"}`, ""),
		chunk(`{"content":[{"type":"text","text":"!"},{"type":"image_url","image_url":{"url":"x"}}]}`, "stop"),
		usageChunk,
		"[DONE]",
	)))
	chats := memory.NewChatStore()
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, chats)
	sink, err := run(t, a, domain.RunRequest{Target: "magistral-medium-2509", Input: []byte("hi"), SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if sink.Text() != "Hello!" || reasoning(sink) != "Let me think" {
		t.Errorf("text %q reasoning %q, want %q and %q", sink.Text(), reasoning(sink), "Hello!", "Let me think")
	}
	if done.Usage.StopReason != "stop" || done.Usage.TotalTokens != 19 {
		t.Errorf("usage %+v", done.Usage)
	}
	// The next turn replays the reply as text.
	if _, err := run(t, a, domain.RunRequest{Target: "magistral-medium-2509", Input: []byte("again"), SessionID: "s1"}); err != nil {
		t.Fatal(err)
	}
	if got := string(srv.Request(t, 1).Body["messages"]); !strings.Contains(got, `{"role":"assistant","content":"Hello!"}`) {
		t.Errorf("second turn's messages = %s, want the reply as text", got)
	}
}

// One field of a chunk the adapter cannot read as it expects (token counts
// written as floats, as some Python servers do) must not lose the chunk's
// other content: the answer's last text, its finish_reason and the usage.
func TestOddFieldKeepsTheRestOfTheChunk(t *testing.T) {
	srv := standin.NewServer(t, sse(events("\n",
		chunk(`{"role":"assistant","content":"Hi"}`, ""),
		`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"served-model","choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"length"}],"usage":{"prompt_tokens":3.0,"completion_tokens":2.0,"total_tokens":5.0}}`,
		"[DONE]",
	)))
	a := newAdapter(t, domain.AdapterConfig{BaseURL: srv.URL}, nil)
	sink, err := run(t, a, domain.RunRequest{Target: "m", Input: []byte("hi")})
	if err != nil {
		t.Fatal(err)
	}
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if sink.Text() != "Hi there" {
		t.Errorf("text %q, want %q", sink.Text(), "Hi there")
	}
	if u := done.Usage; u.PromptTokens != 3 || u.CompletionTokens != 2 || u.TotalTokens != 5 || u.StopReason != "length" {
		t.Errorf("usage %+v, want 3/2/5 and stop reason length", u)
	}
}
