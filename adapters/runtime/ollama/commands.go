package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"iop/adapters/runtime/internal/lines"
	"iop/adapters/runtime/internal/upstream"
	"iop/domain"
	"iop/domain/nodecmd"
	"iop/internal/jsonwords"
)

// The ollama.* node commands, named by the contract (domain/nodecmd, which
// also holds the result types iop reads). Arguments are a JSON object; its
// "adapter" key (used by the node to pick an adapter) is dropped and every
// other key is sent to Ollama as is, so e.g. {"model":"x","verbose":true} reaches
// /api/show whole. Results are Ollama's JSON, unchanged; an empty success
// body (delete, copy) is reported as {"status":"success"}.
const (
	CmdVersion = nodecmd.CmdOllamaVersion // GET /api/version
	CmdList    = nodecmd.CmdOllamaList    // GET /api/tags
	CmdPS      = nodecmd.CmdOllamaPS      // GET /api/ps
	CmdShow    = nodecmd.CmdOllamaShow    // POST /api/show {"model"}
	CmdPull    = nodecmd.CmdOllamaPull    // POST /api/pull {"model"}, streamed: every line goes to progress
	CmdDelete  = nodecmd.CmdOllamaDelete  // DELETE /api/delete {"model"}
	CmdCopy    = nodecmd.CmdOllamaCopy    // POST /api/copy {"source","destination"}
)

// Commands lists the ollama.* family in documentation order.
var Commands = []string{CmdVersion, CmdList, CmdPS, CmdShow, CmdPull, CmdDelete, CmdCopy}

// maxResult bounds a command's non-streamed result.
const maxResult = 32 << 20

func successResult() []byte { return []byte(`{"status":"success"}`) }

// queryPaths are the Ollama endpoints of the commands that only read.
var queryPaths = map[string]string{CmdVersion: "/api/version", CmdList: "/api/tags", CmdPS: "/api/ps"}

// RunCommand serves the ollama.* family. Errors: invalid_request for bad or
// missing arguments, unknown_command for other names, and for Ollama's own
// failures its message with code model_not_found (404 or "not found"),
// provider_error, or provider_unreachable. A cancelled ctx returns
// ctx.Err(); a failing progress callback aborts the pull and returns its
// error.
func (a *Adapter) RunCommand(ctx context.Context, name string, args []byte, progress func(json []byte) error) ([]byte, error) {
	switch name {
	case CmdVersion, CmdList, CmdPS:
		// They take no arguments but a selector; arguments that are not
		// a JSON object ("5", "[1]") were ignored, and the command answered
		// as if they were right.
		if _, err := commandBody(name, args); err != nil {
			return nil, err
		}
		return a.call(ctx, http.MethodGet, queryPaths[name], nil)
	case CmdShow, CmdDelete, CmdPull:
		body, err := commandBody(name, args, "model")
		if err != nil {
			return nil, err
		}
		switch name {
		case CmdShow:
			return a.call(ctx, http.MethodPost, "/api/show", body)
		case CmdDelete:
			return a.call(ctx, http.MethodDelete, "/api/delete", body)
		default:
			return a.pull(ctx, body, progress)
		}
	case CmdCopy:
		body, err := commandBody(name, args, "source", "destination")
		if err != nil {
			return nil, err
		}
		return a.call(ctx, http.MethodPost, "/api/copy", body)
	}
	return nil, domain.Errorf(domain.CodeUnknownCommand, "ollama adapter %q has no command %q (known: %s)", a.name, name, strings.Join(Commands, ", "))
}

// commandBody turns command arguments into the upstream request body,
// checking that each required key holds a non-empty string.
func commandBody(name string, args []byte, required ...string) ([]byte, error) {
	fields := map[string]json.RawMessage{}
	if t := bytes.TrimSpace(args); len(t) > 0 && string(t) != "null" {
		if err := json.Unmarshal(t, &fields); err != nil || fields == nil {
			return nil, domain.Errorf(domain.CodeInvalidRequest, "%s: arguments must be a JSON object", name)
		}
	}
	// The node's selectors ({"adapter"} or {"provider"}: which Ollama
	// answers) are not Ollama's fields.
	delete(fields, "adapter")
	delete(fields, "provider")
	for _, k := range required {
		var s string
		// A value of another type is named as such: {"model":5} was
		// refused as if "model" were missing.
		var te *json.UnmarshalTypeError
		if err := json.Unmarshal(fields[k], &s); errors.As(err, &te) {
			return nil, domain.Errorf(domain.CodeInvalidRequest, "%s: %q must be a string, not %s", name, k, jsonwords.WithArticle(te.Value))
		}
		if s == "" {
			return nil, domain.Errorf(domain.CodeInvalidRequest, "%s: %q is required (args: {%s})", name, k, quoteAll(required))
		}
	}
	if name == CmdPull {
		delete(fields, "stream") // progress needs the streamed form
	}
	return json.Marshal(fields)
}

func quoteAll(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = fmt.Sprintf("%q:…", k)
	}
	return strings.Join(q, ",")
}

// call makes one request and returns Ollama's JSON result.
func (a *Adapter) call(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	resp, err := upstream.Do(ctx, a.hc, method, a.url(path), body, a.header())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResult+1))
	if err != nil {
		return nil, upstream.TransportError(ctx, err)
	}
	if len(b) > maxResult {
		return nil, domain.Errorf(domain.CodeProviderError, "Ollama's answer to %s %s exceeds %d MiB", method, path, maxResult>>20)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return successResult(), nil
	}
	if !json.Valid(b) {
		return nil, domain.Errorf(domain.CodeProviderError, "Ollama answered %s %s with something that is not JSON", method, path)
	}
	return b, nil
}

// pull streams /api/pull: every JSON line goes to progress as is, in order;
// an {"error":…} line ends the pull with Ollama's message; the result is
// {"status":"success"} once Ollama has said so.
func (a *Adapter) pull(ctx context.Context, body []byte, progress func([]byte) error) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := upstream.Do(ctx, a.hc, http.MethodPost, a.url("/api/pull"), body, a.header())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := lines.NewReader(resp.Body, 1<<20)
	succeeded := false
	for {
		line, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, upstream.TransportError(ctx, err)
		}
		line = bytes.TrimSpace(line)
		var l struct {
			Status string          `json:"status"`
			Error  json.RawMessage `json:"error"`
		}
		if len(line) == 0 || json.Unmarshal(line, &l) != nil {
			continue
		}
		if len(l.Error) > 0 && string(l.Error) != "null" {
			msg, code := upstream.ErrorField(l.Error)
			return nil, upstream.ProviderError(msg, code)
		}
		if progress != nil {
			if err := progress(bytes.Clone(line)); err != nil {
				return nil, err
			}
		}
		if l.Status == "success" {
			succeeded = true
		}
	}
	if !succeeded {
		return nil, domain.Errorf(domain.CodeProviderError, "Ollama's pull stream ended without \"success\"")
	}
	return successResult(), nil
}
