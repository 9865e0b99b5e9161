package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"iop/adapters/runtime/runtimetest"
	"iop/domain"
)

// chunkReader reads at most n bytes at a time.
type chunkReader struct {
	r *bytes.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// FuzzChatStream feeds arbitrary chat-completion streams (SSE) and
// non-streamed bodies to the reader: it must never panic, must end with
// nil or an upstream error (the body never fails here), and every
// metadata event it emits must be JSON. Where the body is split must not
// change the events.
func FuzzChatStream(f *testing.F) {
	for _, s := range []string{
		": OPENROUTER PROCESSING\n\n" +
			`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"role":"assistant","reasoning":"Hm","content":"Hel"},"finish_reason":null}],"usage":null}` + "\n\n" +
			`data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-x","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}` + "\n\n" +
			`data: {"id":"c1","model":"gpt-x","choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}` + "\n\n" +
			"data: [DONE]\n\n",
		`data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"a\""}}]}}]}` + "\n\n" +
			`data: {"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]},"finish_reason":"tool_calls"}]}` + "\n\n" +
			"data: [DONE]\n\n",
		"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"x\"}}]}\r\ndata: \r\n\r\n",
		`data: {"error":{"message":"overloaded","type":"server_error","code":529}}` + "\n\n",
		`{"id":"c","object":"chat.completion","model":"m","choices":[{"message":{"role":"assistant","content":"Hi","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`,
		`<html>502</html>`,
	} {
		f.Add([]byte(s), strings.HasPrefix(s, "data") || strings.HasPrefix(s, ":"), true, uint8(0))
	}
	f.Fuzz(func(t *testing.T, body []byte, sse, keep bool, split uint8) {
		read := func(n int) ([]domain.RunEvent, *stream, error) {
			sink := &runtimetest.Sink{}
			s := &stream{sink: sink, keepCalls: keep}
			r := &chunkReader{r: bytes.NewReader(body), n: n}
			var err error
			if sse {
				err = s.readSSE(r)
			} else {
				err = s.readWhole(r)
			}
			return sink.Events(), s, err
		}
		evs, s, err := read(len(body) + 1)
		if err != nil && !errors.As(err, new(*upstreamErr)) {
			t.Fatalf("error %v is not the upstream's", err)
		}
		for _, ev := range evs {
			if ev.Type == domain.EventMetadata && !json.Valid(ev.Metadata) {
				t.Fatalf("metadata is not JSON: %q", ev.Metadata)
			}
		}
		for _, c := range s.calls.merged() {
			if !json.Valid(c) {
				t.Fatalf("merged tool call is not JSON: %q", c)
			}
		}
		if split > 0 {
			evs2, _, err2 := read(int(split))
			if (err == nil) != (err2 == nil) || len(evs) != len(evs2) {
				t.Fatalf("in reads of %d: %d events (%v), whole: %d (%v)", split, len(evs2), err2, len(evs), err)
			}
		}
	})
}
