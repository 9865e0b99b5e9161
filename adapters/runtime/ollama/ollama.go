// Package ollama is the runtime adapter for Ollama's native API.
//
// A run is one streaming POST {base_url}/api/chat. The model is the run's
// target, else the adapter's first configured model. The input is the user
// message as text, or {"messages":[…]} (see package chat). The run options,
// a JSON object, may carry "tools" (a JSON array), "think", "options",
// "format" and "keep_alive", which are passed to Ollama unchanged; other
// keys are ignored.
//
// Ollama answers with NDJSON. Each line's message.thinking becomes a
// reasoning_delta event and message.content a delta event (in that order
// when a line has both); message.tool_calls becomes a metadata event
// {"tool_calls":[…]}. The final line, "done": true, becomes the complete
// event with usage: prompt_eval_count and eval_count as prompt and
// completion tokens, their sum as total, total_duration in milliseconds,
// done_reason as the stop reason, and the model. Malformed lines are
// skipped. An {"error":"…"} line (Ollama reports failures after streaming
// started that way, with status 200) or a non-2xx response becomes an error
// event carrying Ollama's own message, with code model_not_found (HTTP 404,
// or a message saying "not found"), else provider_error (a 404 without
// Ollama's error, or any model named in it, is no unknown model but an
// endpoint base_url does not reach: provider_error); a failure to
// connect is provider_unreachable; a stream that ends without its done line
// is provider_error. A configured timeout that expires is an error event
// with code timeout.
//
// Cancelling ctx aborts the HTTP request, which closes the connection — the
// only way to stop an Ollama generation — and Execute returns ctx.Err()
// without a terminal event.
//
// Sessions: a run with a session id sends the session's stored history
// before its own messages; when it completes, its messages (as given) and
// the assistant's reply (the concatenated content, without thinking, with
// the message.tool_calls of the stream) are appended, so the caller's next
// {"role":"tool",…} messages follow the call they answer. A failed or
// cancelled run leaves the session unchanged.
package ollama

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"iop/adapters/runtime/internal/chat"
	"iop/adapters/runtime/internal/lines"
	"iop/adapters/runtime/internal/runlimit"
	"iop/adapters/runtime/internal/upstream"
	"iop/domain"
	"iop/ports"
)

// Options passed through from a run's options to /api/chat. Without
// "tools" the model is never offered a tool, so it never calls one.
var passThrough = []string{"tools", "think", "options", "format", "keep_alive"}

// Adapter runs chats against one Ollama server. It is safe for concurrent use.
type Adapter struct {
	name           string
	base           string // base_url without its query or a trailing "/"
	query          string // "?" and base_url's query, or ""
	models         []string
	maxConcurrency int
	timeout        time.Duration
	hc             *http.Client
	sessions       *chat.Sessions
	// apiKeyEnv names the variable of the node's environment whose value
	// goes as "Authorization: Bearer" on every request (WithAPIKeyEnv).
	apiKeyEnv string
}

var (
	_ ports.RuntimeAdapter    = (*Adapter)(nil)
	_ ports.RunAdmitter       = (*Adapter)(nil)
	_ ports.SessionTerminator = (*Adapter)(nil)
	_ ports.SessionLister     = (*Adapter)(nil)
	_ ports.CommandRunner     = (*Adapter)(nil)
	_ io.Closer               = (*Adapter)(nil)
)

// Option changes how New builds the adapter.
type Option func(*Adapter)

// WithHTTPClient makes the adapter use hc instead of a client of its own.
func WithHTTPClient(hc *http.Client) Option {
	return func(a *Adapter) { a.hc = hc }
}

// WithAPIKeyEnv makes the adapter send the value of the node's environment
// variable env, read at each request, as "Authorization: Bearer <value>"
// (nothing while it is unset or empty). Ollama adapters are configured
// without a key (the edge refuses api_key_env on them); the command-only
// adapter serving an ollama provider's ollama.* commands is given the
// provider's, so the commands reach an Ollama behind an authenticating
// proxy (or ollama.com) as its tunnels do.
func WithAPIKeyEnv(env string) Option {
	return func(a *Adapter) { a.apiKeyEnv = env }
}

// header is the header of a request to the server: the key, if any.
func (a *Adapter) header() http.Header {
	if auth := upstream.Bearer(a.apiKeyEnv); auth != "" {
		return http.Header{"Authorization": {auth}}
	}
	return nil
}

// New builds an ollama adapter. cfg.BaseURL must be an http(s) URL; chats
// keeps sessions (nil: the adapter keeps none). Errors are domain.ErrConfig.
func New(cfg domain.AdapterConfig, chats ports.ChatSessionStore, opts ...Option) (*Adapter, error) {
	if err := checkBaseURL(cfg); err != nil {
		return nil, err
	}
	if cfg.MaxConcurrency < 0 || cfg.Timeout < 0 {
		return nil, domain.Errorf(domain.CodeConfigError, "ollama adapter %q: max_concurrency and timeout must not be negative", cfg.Name)
	}
	if err := domain.CheckMaxHistoryBytes(cfg.Name, cfg.MaxHistoryBytes); err != nil {
		return nil, err
	}
	// A provider's base_url may carry a query (a proxy's token), which
	// every request keeps after its path, as the provider client does; an
	// adapter's has none (the edge refuses it).
	base, query, _ := strings.Cut(cfg.BaseURL, "?")
	if query != "" {
		query = "?" + query
	}
	a := &Adapter{
		name:           cfg.Name,
		base:           strings.TrimSuffix(base, "/"),
		query:          query,
		models:         append([]string(nil), cfg.Models...),
		maxConcurrency: cmp.Or(cfg.MaxConcurrency, domain.DefaultMaxConcurrency),
		timeout:        cfg.Timeout,
		sessions:       chat.NewSessions(chats, cfg.Name, cfg.MaxHistoryBytes),
	}
	for _, o := range opts {
		o(a)
	}
	if a.hc == nil {
		a.hc = upstream.NewClient()
	}
	return a, nil
}

// url is the address of path on the server, base_url's query kept.
func (a *Adapter) url(path string) string { return a.base + path + a.query }

func checkBaseURL(cfg domain.AdapterConfig) error {
	u, err := url.Parse(cfg.BaseURL)
	if cfg.BaseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return domain.Errorf(domain.CodeConfigError, "%s adapter %q: base_url %q must be an http(s) URL such as http://127.0.0.1:11434", cfg.Type, cfg.Name, domain.RedactURL(cfg.BaseURL))
	}
	return nil
}

// Capabilities reports the configured concurrency, sessions (when a store
// was given) and the ollama.* command family.
func (a *Adapter) Capabilities() domain.Capabilities {
	return domain.Capabilities{MaxConcurrency: a.maxConcurrency, Sessions: a.sessions.Enabled(), Commands: append([]string(nil), Commands...)}
}

// Close drops idle connections to the server.
func (a *Adapter) Close() error {
	a.hc.CloseIdleConnections()
	return nil
}

// TerminateSession forgets a session's history; a session without one is
// session_not_found.
func (a *Adapter) TerminateSession(ctx context.Context, _ string, sessionID string) error {
	return a.sessions.Terminate(ctx, sessionID)
}

// ListSessions returns the page q asks for of the adapter's sessions.
func (a *Adapter) ListSessions(ctx context.Context, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	return a.sessions.List(ctx, q)
}

// Admit refuses, before the node acknowledges the run, a run Execute would
// refuse for its own content: no model (no target and no models
// configured), input that is empty or holds bad messages, options that are
// no JSON object or whose "tools" is no array (checkOptions). Its caller
// gets an honest refusal rather than a started run that fails.
func (a *Adapter) Admit(req domain.RunRequest) error {
	p, err := a.sessions.Check(req, a.models)
	if err != nil {
		return err
	}
	return checkOptions(p.Options)
}

// checkOptions refuses run options Ollama would refuse with a JSON decoding
// error about its own request type: a "tools" that is not a JSON array.
func checkOptions(opts map[string]json.RawMessage) error {
	if t, ok := opts["tools"]; ok {
		if v := bytes.TrimSpace(t); len(v) == 0 || (v[0] != '[' && string(v) != "null") {
			return domain.Errorf(domain.CodeInvalidRequest, `run option "tools" must be a JSON array of tools`)
		}
	}
	return nil
}

// chatLine is one NDJSON line of /api/chat.
type chatLine struct {
	Model   string `json:"model"`
	Message *struct {
		Content   string          `json:"content"`
		Thinking  string          `json:"thinking"`
		ToolCalls json.RawMessage `json:"tool_calls"`
	} `json:"message"`
	Done            bool            `json:"done"`
	DoneReason      string          `json:"done_reason"`
	TotalDuration   int64           `json:"total_duration"`
	PromptEvalCount int64           `json:"prompt_eval_count"`
	EvalCount       int64           `json:"eval_count"`
	Error           json.RawMessage `json:"error"`
}

// Execute runs one chat turn as the package doc describes. Invalid input,
// options or a missing model are returned as invalid_request errors before
// anything is sent; upstream failures are error events; a cancelled ctx
// returns ctx.Err(); a failing sink returns its error.
func (a *Adapter) Execute(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
	prep, err := a.sessions.Prepare(ctx, req, a.models)
	if err != nil {
		return err
	}
	model, opts, turn, msgs := prep.Model, prep.Options, prep.Turn, prep.Messages
	if err := checkOptions(opts); err != nil {
		return err
	}
	body := map[string]any{"model": model, "messages": msgs, "stream": true}
	for _, k := range passThrough {
		if v, ok := opts[k]; ok {
			body[k] = v
		}
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode chat request: %w", err)
	}

	limit := runlimit.New(ctx, a.timeout)
	defer limit.Stop()
	resp, err := upstream.Do(limit.Context(), a.hc, http.MethodPost, a.url("/api/chat"), payload, a.header())
	if err != nil {
		return limit.Fail(sink, "ollama chat", err)
	}
	defer resp.Body.Close()

	var reply strings.Builder
	var calls []json.RawMessage // the reply's tool calls, kept for the session
	callBytes := 0
	r := lines.NewReader(resp.Body, 0)
	// Whether a line was Ollama's, and else the first line that came: a
	// 200 answer that is no stream (a proxy's login page) is named.
	var ollamaLine bool
	var first []byte
	for {
		line, err := r.Next()
		if errors.Is(err, io.EOF) {
			if !ollamaLine {
				return limit.Fail(sink, "ollama chat", upstream.WithoutCredentials(notAStream(resp.Header.Get("Content-Type"), first), resp.Request))
			}
			return limit.Fail(sink, "ollama chat", domain.Errorf(domain.CodeProviderError, "Ollama's stream ended before its final \"done\" line"))
		}
		if err != nil {
			return limit.Fail(sink, "ollama chat", upstream.TransportError(limit.Context(), err))
		}
		var l chatLine
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if json.Unmarshal(line, &l) != nil {
			if first == nil {
				first = bytes.Clone(line[:min(len(line), 256)])
			}
			continue
		}
		ollamaLine = true
		if len(l.Error) > 0 && string(l.Error) != "null" {
			msg, code := upstream.ErrorField(l.Error)
			// Quoted to the caller: a server echoing what it was sent
			// must not show base_url's password.
			return limit.Fail(sink, "ollama chat", upstream.WithoutCredentials(upstream.ProviderError(msg, code), resp.Request))
		}
		if m := l.Message; m != nil {
			if m.Thinking != "" {
				if err := sink.Emit(domain.RunEvent{Type: domain.EventReasoningDelta, Text: m.Thinking}); err != nil {
					return err
				}
			}
			if m.Content != "" {
				reply.WriteString(m.Content)
				if err := sink.Emit(domain.RunEvent{Type: domain.EventDelta, Text: m.Content}); err != nil {
					return err
				}
			}
			if len(m.ToolCalls) > 0 && string(m.ToolCalls) != "null" {
				// Ollama sends each call whole, so they are collected,
				// not merged, for a session's history only (a run without
				// one keeps nothing, so the bound cannot fail it).
				var cs []json.RawMessage
				if req.SessionID != "" && json.Unmarshal(m.ToolCalls, &cs) == nil {
					callBytes += len(m.ToolCalls)
					if callBytes > chat.MaxToolCallBytes {
						return limit.Fail(sink, "ollama chat", domain.Errorf(domain.CodeProviderError, "Ollama's tool calls exceed %d bytes", chat.MaxToolCallBytes))
					}
					calls = append(calls, cs...)
				}
				meta, _ := json.Marshal(map[string]json.RawMessage{"tool_calls": m.ToolCalls})
				if err := sink.Emit(domain.RunEvent{Type: domain.EventMetadata, Metadata: meta}); err != nil {
					return err
				}
			}
		}
		if !l.Done {
			continue
		}
		if err := a.sessions.Commit(ctx, sink, model, req.SessionID, turn, chat.Reply{Content: reply.String(), ToolCalls: calls}); err != nil {
			return err
		}
		return sink.Emit(domain.RunEvent{Type: domain.EventComplete, Usage: &domain.Usage{
			PromptTokens:     l.PromptEvalCount,
			CompletionTokens: l.EvalCount,
			TotalTokens:      domain.AddTokens(l.PromptEvalCount, l.EvalCount),
			DurationMS:       l.TotalDuration / int64(time.Millisecond),
			StopReason:       l.DoneReason,
			Model:            cmp.Or(l.Model, model),
		}})
	}
}

// notAStream is the provider_error for a 200 answer without one line of
// Ollama's stream: what came (its content type and first line), or that it
// was empty.
func notAStream(ctype string, first []byte) error {
	if first == nil {
		return domain.Errorf(domain.CodeProviderError, "the server answered with an empty body (content type %q), not Ollama's stream", ctype)
	}
	return domain.Errorf(domain.CodeProviderError, "the server answered with %q, not Ollama's stream: %s", ctype, upstream.Snippet(first, 200))
}
