package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// ollamaStandIn speaks the parts of Ollama's documented API the Ollama CLI
// uses: GET/HEAD /, /api/version, /api/tags, /api/ps, /api/show,
// /api/chat (non-streamed), /api/pull and /api/create (NDJSON progress),
// /api/push, /api/copy, DELETE /api/delete, HEAD/POST /api/blobs/:digest.
// Unknown models get Ollama's exact `{"error":"model 'x' not found"}`.
type ollamaStandIn struct {
	*httptest.Server
	name   string
	mu     sync.Mutex
	models map[string]bool
	blobs  map[string]bool
	sent   map[string][]byte // path → the last body answered there
}

func newOllamaStandIn(t testing.TB, name string, models ...string) *ollamaStandIn {
	o := &ollamaStandIn{name: name, models: map[string]bool{}, blobs: map[string]bool{}, sent: map[string][]byte{}}
	for _, m := range models {
		o.models[m] = true
	}
	o.Server = httptest.NewServer(http.HandlerFunc(o.serve))
	t.Cleanup(o.Close)
	return o
}

func (o *ollamaStandIn) has(m string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.models[m] || o.models[m+":latest"] || o.models[strings.TrimSuffix(m, ":latest")]
}

func (o *ollamaStandIn) lastSent(path string) []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]byte(nil), o.sent[path]...)
}

// write answers with Gin's JSON headers, sized, as Ollama does.
func (o *ollamaStandIn) write(w http.ResponseWriter, r *http.Request, status int, body string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(status)
	io.WriteString(w, body)
	o.mu.Lock()
	o.sent[r.URL.Path] = []byte(body)
	o.mu.Unlock()
}

func (o *ollamaStandIn) notFound(w http.ResponseWriter, r *http.Request, m string) {
	o.write(w, r, 404, fmt.Sprintf(`{"error":"model '%s' not found"}`, m))
}

// progress streams NDJSON lines, flushed one by one, as pull/create/push do.
func (o *ollamaStandIn) progress(w http.ResponseWriter, r *http.Request, lines []string) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	var all []byte
	for _, l := range lines {
		b := []byte(l + "\n")
		w.Write(b)
		w.(http.Flusher).Flush()
		all = append(all, b...)
		time.Sleep(5 * time.Millisecond)
	}
	o.mu.Lock()
	o.sent[r.URL.Path] = all
	o.mu.Unlock()
}

func (o *ollamaStandIn) serve(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model, Name, Source, Destination string
	}
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &req)
	model := req.Model
	if model == "" {
		model = req.Name
	}
	switch {
	case r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead):
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", "17")
		w.WriteHeader(200)
		if r.Method == http.MethodGet {
			io.WriteString(w, "Ollama is running")
		}
	case r.URL.Path == "/api/version":
		o.write(w, r, 200, `{"version":"0.12.6"}`)
	case r.URL.Path == "/api/tags":
		o.mu.Lock()
		var names []string
		for m := range o.models {
			names = append(names, m)
		}
		o.mu.Unlock()
		sort.Strings(names)
		var parts []string
		for _, m := range names {
			parts = append(parts, fmt.Sprintf(`{"name":%q,"model":%q,"modified_at":"2026-01-01T00:00:00Z","size":1000,"digest":"d-%s","details":{"format":"gguf"}}`, m, m, m))
		}
		o.write(w, r, 200, `{"models":[`+strings.Join(parts, ",")+`]}`)
	case r.URL.Path == "/api/ps":
		o.write(w, r, 200, fmt.Sprintf(`{"models":[{"name":"loaded-on-%s","model":"loaded-on-%s","size":5,"digest":"x","expires_at":"2026-01-01T00:05:00Z","size_vram":5}]}`, o.name, o.name))
	case r.URL.Path == "/api/show" || r.URL.Path == "/api/chat":
		if !o.has(model) {
			o.notFound(w, r, model)
			return
		}
		if r.URL.Path == "/api/show" {
			o.write(w, r, 200, fmt.Sprintf(`{"modelfile":"FROM %s","parameters":"","template":"{{ .Prompt }}","details":{"format":"gguf"},"capabilities":["completion"]}`, model))
			return
		}
		o.write(w, r, 200, fmt.Sprintf(`{"model":%q,"created_at":"2026-01-01T00:00:00Z","message":{"role":"assistant","content":"hi from %s"},"done":true,"done_reason":"stop","total_duration":1000000,"prompt_eval_count":3,"eval_count":2}`, model, o.name))
	case r.URL.Path == "/api/pull":
		lines := []string{`{"status":"pulling manifest"}`}
		for i := 0; i <= 4; i++ {
			lines = append(lines, fmt.Sprintf(`{"status":"pulling 6a0746a1ec1a","digest":"sha256:6a0746a1ec1a","total":400,"completed":%d}`, i*100))
		}
		lines = append(lines, `{"status":"verifying sha256 digest"}`, `{"status":"writing manifest"}`, `{"status":"success"}`)
		o.mu.Lock()
		o.models[model] = true
		o.mu.Unlock()
		o.progress(w, r, lines)
	case r.URL.Path == "/api/push":
		if !o.has(model) {
			o.notFound(w, r, model)
			return
		}
		o.progress(w, r, []string{`{"status":"retrieving manifest"}`, `{"status":"success"}`})
	case r.URL.Path == "/api/create":
		o.mu.Lock()
		o.models[model] = true
		o.mu.Unlock()
		o.progress(w, r, []string{`{"status":"parsing GGUF"}`, `{"status":"writing manifest"}`, `{"status":"success"}`})
	case r.URL.Path == "/api/copy":
		if !o.has(req.Source) {
			o.notFound(w, r, req.Source)
			return
		}
		o.mu.Lock()
		o.models[req.Destination] = true
		o.mu.Unlock()
		w.WriteHeader(200)
	case r.URL.Path == "/api/delete" && r.Method == http.MethodDelete:
		if !o.has(model) {
			o.notFound(w, r, model)
			return
		}
		o.mu.Lock()
		delete(o.models, model)
		delete(o.models, model+":latest")
		o.mu.Unlock()
		w.WriteHeader(200)
	case strings.HasPrefix(r.URL.Path, "/api/blobs/"):
		d := strings.TrimPrefix(r.URL.Path, "/api/blobs/")
		if r.Method == http.MethodHead {
			o.mu.Lock()
			ok := o.blobs[d]
			o.mu.Unlock()
			if !ok {
				w.WriteHeader(404)
				return
			}
			w.WriteHeader(200)
			return
		}
		if fmt.Sprintf("sha256:%x", sha256.Sum256(body)) != d {
			o.write(w, r, 400, `{"error":"digest mismatch"}`)
			return
		}
		o.mu.Lock()
		o.blobs[d] = true
		o.mu.Unlock()
		w.WriteHeader(201)
	default:
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(404)
		io.WriteString(w, "404 page not found")
	}
}

// The Ollama CLI's requests, made as it makes them, through the edge to
// Ollama stand-ins on two nodes.
func TestOllamaClientsThroughTheEdge(t *testing.T) {
	t.Parallel()
	o1 := newOllamaStandIn(t, "n1", "tiny:latest")
	o2 := newOllamaStandIn(t, "n2", "other:latest")
	nodes := fmt.Sprintf(`
  - id: n1
    token: %s
    providers:
      - {name: ollama, type: ollama, base_url: %q}
  - id: n2
    token: e2e-token-0002
    providers:
      - {name: ollama, type: ollama, base_url: %q}
`, testToken, o1.URL, o2.URL)
	e := startEdge(t, nodes)
	startNode(t, e, testToken)
	startNode(t, e, "e2e-token-0002")
	waitNode(t, e, "n1")
	waitNode(t, e, "n2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	do := func(method, path, body string, hdr ...string) (*http.Response, []byte) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequestWithContext(ctx, method, e.url+path, rd)
		req.Header.Set("User-Agent", "ollama/0.12.6 (amd64 linux) Go/go1.24")
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s %s: body: %v", method, path, err)
		}
		return resp, b
	}

	// Every CLI command starts with HEAD /.
	for _, m := range []string{http.MethodHead, http.MethodGet} {
		resp, b := do(m, "/", "")
		want := "Ollama is running"
		if m == http.MethodHead {
			want = ""
		}
		if resp.StatusCode != 200 || string(b) != want || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
			t.Fatalf("%s /: %d %q", m, resp.StatusCode, b)
		}
	}
	// ollama -v
	if resp, b := do(http.MethodGet, "/api/version", ""); resp.StatusCode != 200 || !strings.Contains(string(b), `"version"`) {
		t.Fatalf("/api/version: %d %s", resp.StatusCode, b)
	}
	// ollama list / ollama ps: both nodes merged.
	names := func(b []byte) string {
		var doc struct{ Models []struct{ Name string } }
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("list %s: %v", b, err)
		}
		var out []string
		for _, m := range doc.Models {
			out = append(out, m.Name)
		}
		sort.Strings(out)
		return strings.Join(out, " ")
	}
	if resp, b := do(http.MethodGet, "/api/tags", ""); resp.StatusCode != 200 || names(b) != "other:latest tiny:latest" {
		t.Fatalf("/api/tags: %d %s", resp.StatusCode, b)
	}
	if resp, b := do(http.MethodGet, "/api/ps", ""); resp.StatusCode != 200 || names(b) != "loaded-on-n1 loaded-on-n2" {
		t.Fatalf("/api/ps: %d %s", resp.StatusCode, b)
	}

	// ollama run missing: show answers Ollama's exact not-found text.
	resp, b := do(http.MethodPost, "/api/show", `{"model":"missing"}`)
	if resp.StatusCode != 404 || string(b) != `{"error":"model 'missing' not found"}`+"\n" || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Fatalf("show missing: %d %q %v", resp.StatusCode, b, resp.Header)
	}
	// …then pull: two nodes have an Ollama, so the edge asks for a pick.
	resp, b = do(http.MethodPost, "/api/pull", `{"model":"missing","stream":true}`)
	if resp.StatusCode != 400 || !strings.Contains(string(b), "X-IOP-Node") {
		t.Fatalf("pull without a node: %d %s", resp.StatusCode, b)
	}
	// Pinned, the progress stream passes through line by line, unchanged.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/api/pull", strings.NewReader(`{"model":"missing","stream":true}`))
	req.Header.Set(nodeHeader, "n2")
	presp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(presp.Body)
	var got []byte
	lines := 0
	for sc.Scan() {
		var st struct{ Status string }
		if json.Unmarshal(sc.Bytes(), &st) != nil || st.Status == "" {
			t.Fatalf("progress line %q", sc.Bytes())
		}
		got = append(append(got, sc.Bytes()...), '\n')
		lines++
	}
	presp.Body.Close()
	if presp.StatusCode != 200 || lines != 9 || !bytes.Equal(got, o2.lastSent("/api/pull")) || !strings.HasPrefix(presp.Header.Get("Content-Type"), "application/x-ndjson") {
		t.Fatalf("pull progress: %d, %d lines, %q", presp.StatusCode, lines, got)
	}
	// The pulled model is usable at once (the catalog refreshes on a miss).
	if resp, b := do(http.MethodPost, "/api/chat", `{"model":"missing","stream":false,"messages":[]}`); resp.StatusCode != 200 || !strings.Contains(string(b), "hi from n2") {
		t.Fatalf("chat after pull: %d %s", resp.StatusCode, b)
	}

	// ollama cp then ollama run the copy: found at once, on the right node.
	if resp, b := do(http.MethodPost, "/api/copy", `{"source":"tiny","destination":"tiny3"}`); resp.StatusCode != 200 {
		t.Fatalf("copy: %d %s", resp.StatusCode, b)
	}
	resp, b = do(http.MethodPost, "/api/chat", `{"model":"tiny3","stream":false,"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 200 || !strings.Contains(string(b), "hi from n1") {
		t.Fatalf("chat with the copy: %d %s", resp.StatusCode, b)
	}
	// A relayed, non-streamed answer keeps its Content-Length (not chunked).
	if !bytes.Equal(b, o1.lastSent("/api/chat")) || resp.ContentLength != int64(len(b)) || len(resp.TransferEncoding) != 0 {
		t.Fatalf("relayed chat: length %d, TE %v, %q", resp.ContentLength, resp.TransferEncoding, b)
	}
	if resp, b := do(http.MethodGet, "/api/tags", ""); !strings.Contains(names(b), "tiny3") {
		t.Fatalf("/api/tags after cp: %d %s", resp.StatusCode, b)
	}

	// ollama rm: goes to the node that has it; then the model is gone.
	if resp, b := do(http.MethodDelete, "/api/delete", `{"model":"tiny3"}`); resp.StatusCode != 200 {
		t.Fatalf("delete: %d %s", resp.StatusCode, b)
	}
	// (The provider's own 404 when the catalog still lists it, else the
	// edge's: the same text either way.)
	if resp, b := do(http.MethodPost, "/api/chat", `{"model":"tiny3","messages":[]}`); resp.StatusCode != 404 || strings.TrimSpace(string(b)) != `{"error":"model 'tiny3' not found"}` {
		t.Fatalf("chat after rm: %d %q", resp.StatusCode, b)
	}

	// ollama create: HEAD the blob (missing), upload it, create.
	blob := bytes.Repeat([]byte("GGUF"), 5000)
	digest := fmt.Sprintf("sha256:%x", sha256.Sum256(blob))
	if resp, _ := do(http.MethodHead, "/api/blobs/"+digest, "", nodeHeader, "n1"); resp.StatusCode != 404 {
		t.Fatalf("HEAD missing blob: %d", resp.StatusCode)
	}
	if resp, b := do(http.MethodPost, "/api/blobs/"+digest, string(blob), nodeHeader, "n1"); resp.StatusCode != 201 {
		t.Fatalf("POST blob: %d %s", resp.StatusCode, b)
	}
	if resp, _ := do(http.MethodHead, "/api/blobs/"+digest, "", nodeHeader, "n1"); resp.StatusCode != 200 {
		t.Fatalf("HEAD uploaded blob: %d", resp.StatusCode)
	}
	resp, b = do(http.MethodPost, "/api/create", fmt.Sprintf(`{"model":"mine","files":{"m.gguf":%q}}`, digest), nodeHeader, "n1")
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"success"`) {
		t.Fatalf("create: %d %s", resp.StatusCode, b)
	}
	// ollama push: to the node that has the model.
	if resp, b := do(http.MethodPost, "/api/push", `{"model":"mine"}`); resp.StatusCode != 200 || !strings.Contains(string(b), "success") {
		t.Fatalf("push: %d %s", resp.StatusCode, b)
	}
}

const nodeHeader = "X-IOP-Node"
