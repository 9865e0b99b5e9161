package openaiapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"iop/adapters/config"
	"iop/domain"
	"iop/ports"
)

// recordedStream is a chat completion streamed by api.openai.com with
// stream_options.include_usage, as captured on the wire (ids shortened).
const recordedStream = `data: {"id":"chatcmpl-BRn7x","object":"chat.completion.chunk","created":1745839741,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0392822090","choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-BRn7x","object":"chat.completion.chunk","created":1745839741,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0392822090","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-BRn7x","object":"chat.completion.chunk","created":1745839741,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0392822090","choices":[{"index":0,"delta":{"content":" from"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-BRn7x","object":"chat.completion.chunk","created":1745839741,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0392822090","choices":[{"index":0,"delta":{"content":" behind"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-BRn7x","object":"chat.completion.chunk","created":1745839741,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0392822090","choices":[{"index":0,"delta":{"content":" the NAT"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-BRn7x","object":"chat.completion.chunk","created":1745839741,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0392822090","choices":[{"index":0,"delta":{"content":"."},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-BRn7x","object":"chat.completion.chunk","created":1745839741,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0392822090","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-BRn7x","object":"chat.completion.chunk","created":1745839741,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_0392822090","choices":[],"usage":{"prompt_tokens":14,"completion_tokens":6,"total_tokens":20,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}}

data: [DONE]

`

func TestOfficialOpenAIClientStreamsThroughTheEdge(t *testing.T) {
	e := newEnv(t)
	// Replay the recording in uneven frames, as a node relays reads.
	steps := []step{status(200), header("Content-Type", "text/event-stream; charset=utf-8", "Openai-Processing-Ms", "180")}
	for rest := recordedStream; len(rest) > 0; {
		n := min(len(rest), 97)
		steps = append(steps, body(rest[:n]))
		rest = rest[n:]
	}
	steps = append(steps, step{f: domain.TunnelFrame{Kind: domain.TunnelUsage, Usage: &domain.Usage{PromptTokens: 14, CompletionTokens: 6, TotalTokens: 20}}}, frame(domain.TunnelEnd))
	link := e.node(t, "gpu-box", serve(steps...), provider("openai", domain.ProviderOpenAI, "gpt-4o-mini"))

	client := openai.NewClient(option.WithBaseURL(e.srv.URL+"/v1"), option.WithAPIKey("edge-key"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:         "gpt-4o-mini",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello from behind the NAT.")},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	defer stream.Close()

	var text strings.Builder
	var usage openai.CompletionUsage
	var chunks int
	for stream.Next() {
		chunk := stream.Current()
		chunks++
		for _, c := range chunk.Choices {
			text.WriteString(c.Delta.Content)
		}
		if chunk.JSON.Usage.Valid() && chunk.Usage.TotalTokens > 0 {
			usage = chunk.Usage
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if chunks != 8 || text.String() != "Hello from behind the NAT." {
		t.Fatalf("%d chunks, text %q", chunks, text.String())
	}
	if usage.PromptTokens != 14 || usage.CompletionTokens != 6 || usage.TotalTokens != 20 {
		t.Fatalf("usage = %+v", usage)
	}

	// What reached the provider is the SDK's own request, minus the edge key.
	o := link.last(t)
	var sent struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.Unmarshal(o.body, &sent); err != nil || sent.Model != "gpt-4o-mini" || !sent.Stream || !sent.StreamOptions.IncludeUsage {
		t.Fatalf("forwarded body %s (%v)", o.body, err)
	}
	if o.req.Header.Get("Authorization") != "" || o.req.Path != "/v1/chat/completions" {
		t.Fatalf("forwarded request %+v", o.req)
	}
	waitFor(t, "ledger", func() bool {
		l := e.ledger.Snapshot()
		return len(l) == 1 && l[0].Node == "gpu-box" && l[0].Model == "gpt-4o-mini" && l[0].TotalTokens == 20
	})
}

// The official client's Responses.Compact and Responses.InputTokens.Count
// reach a provider through the edge and read its answers.
func TestOfficialOpenAIClientCompactsAndCountsThroughTheEdge(t *testing.T) {
	e := newEnv(t)
	link := e.node(t, "gpu-box", func(req domain.TunnelRequest) (ports.TunnelStream, error) {
		if req.Path == "/v1/responses/input_tokens" {
			return newFakeStream(response(200, "application/json", `{"object":"response.input_tokens","input_tokens":42}`)...), nil
		}
		return newFakeStream(response(200, "application/json", `{"id":"cmp_1","object":"response.compaction","created_at":1700000000,"output":[],"usage":{"input_tokens":3,"input_tokens_details":{"cached_tokens":0},"output_tokens":1,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":4}}`)...), nil
	}, provider("openai", domain.ProviderOpenAI, "gpt-4o-mini"))

	client := openai.NewClient(option.WithBaseURL(e.srv.URL+"/v1"), option.WithAPIKey("edge-key"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	compacted, err := client.Responses.Compact(ctx, responses.ResponseCompactParams{
		Model: "gpt-4o-mini",
		Input: responses.ResponseCompactParamsInputUnion{OfString: openai.String("a long chat")},
	})
	if err != nil || compacted.ID != "cmp_1" || compacted.Usage.TotalTokens != 4 {
		t.Fatalf("Compact: %+v, %v", compacted, err)
	}
	if o := link.last(t); o.req.Path != "/v1/responses/compact" || !strings.Contains(string(o.body), `"model":"gpt-4o-mini"`) {
		t.Fatalf("Compact forwarded as %s %q", o.req.Path, o.body)
	}
	counted, err := client.Responses.InputTokens.Count(ctx, responses.InputTokenCountParams{
		Model: openai.String("gpt-4o-mini"),
		Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("count me")},
	})
	if err != nil || counted.InputTokens != 42 {
		t.Fatalf("InputTokens.Count: %+v, %v", counted, err)
	}
	if o := link.last(t); o.req.Path != "/v1/responses/input_tokens" || !strings.Contains(string(o.body), `"model":"gpt-4o-mini"`) {
		t.Fatalf("Count forwarded as %s %q", o.req.Path, o.body)
	}
}

// A model declared for a configured node that is not connected (it is
// restarting) is 503 no_node_available with Retry-After, which the official
// client retries, as it is when no node of the API is connected at all:
// with another node connected it was 404 model_not_found, which the SDKs
// take for a model that does not exist and never retry. A model no node
// declares stays 404.
func TestOfficialOpenAIClientRetriesAModelOfANodeThatIsNotConnected(t *testing.T) {
	e := newEnv(t)
	e.tunnels.Nodes = config.NewDirectory([]domain.NodeRecord{
		{ID: "gpu-box", Token: "t1", Providers: []domain.ProviderConfig{provider("openai", domain.ProviderOpenAI, "gpt-4o-mini")}},
		{ID: "big-box", Token: "t2", Providers: []domain.ProviderConfig{provider("vllm", domain.ProviderOpenAI, "llama-70b")}},
	})
	link := e.node(t, "gpu-box", serve(response(200, "application/json", `{"id":"resp_1","object":"response","created_at":1700000000,"status":"completed","model":"gpt-4o-mini","output":[]}`)...),
		provider("openai", domain.ProviderOpenAI, "gpt-4o-mini"))

	tries := 0
	client := openai.NewClient(option.WithBaseURL(e.srv.URL+"/v1"), option.WithAPIKey("edge-key"), option.WithMaxRetries(1),
		option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
			tries++
			return next(r)
		}))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	ask := func(model string) error {
		tries = 0
		_, err := client.Responses.New(ctx, responses.ResponseNewParams{
			Model: model,
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")},
		})
		return err
	}

	var apiErr *openai.Error
	if err := ask("llama-70b"); !errors.As(err, &apiErr) {
		t.Fatalf("llama-70b on a node that is not connected: %v", err)
	}
	if apiErr.StatusCode != http.StatusServiceUnavailable || apiErr.Code != domain.CodeNoNodeAvailable || apiErr.Type != "server_error" ||
		!strings.Contains(apiErr.Message, `"big-box"`) || apiErr.Response.Header.Get("Retry-After") != "1" || tries != 2 {
		t.Fatalf("llama-70b: %d tries, %d %s/%s %q Retry-After %q", tries, apiErr.StatusCode, apiErr.Type, apiErr.Code, apiErr.Message, apiErr.Response.Header.Get("Retry-After"))
	}

	apiErr = nil
	if err := ask("no-such-model"); !errors.As(err, &apiErr) {
		t.Fatalf("a model no node declares: %v", err)
	}
	if apiErr.StatusCode != http.StatusNotFound || apiErr.Code != domain.CodeModelNotFound || tries != 1 {
		t.Fatalf("no-such-model: %d tries, %d %s %q", tries, apiErr.StatusCode, apiErr.Code, apiErr.Message)
	}
	if err := ask("gpt-4o-mini"); err != nil || tries != 1 {
		t.Fatalf("gpt-4o-mini on the connected node: %d tries, %v", tries, err)
	}
	if o := link.last(t); o.req.Path != "/v1/responses" {
		t.Fatalf("forwarded %s", o.req.Path)
	}
}
