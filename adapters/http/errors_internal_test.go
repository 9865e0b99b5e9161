package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"iop/domain"
)

func TestStatusFor(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{domain.ErrInvalidRequest, 400},
		{domain.ErrUnknownCommand, 400},
		{domain.ErrNodeNotFound, 404},
		{domain.ErrRunNotFound, 404},
		{domain.ErrSessionNotFound, 404},
		{domain.ErrAdapterNotFound, 404},
		{domain.ErrModelNotFound, 404},
		{domain.ErrTargetNotFound, 404},
		{domain.ErrRunFinished, 409},
		{domain.ErrSessionBusy, 409},
		{domain.ErrAtCapacity, 429},
		{domain.ErrSessionUnsupported, 501},
		{domain.ErrCommandUnsupported, 501},
		{domain.ErrNoNodeAvailable, 503},
		{domain.ErrNodeDisconnected, 503},
		{domain.ErrShuttingDown, 503},
		{domain.ErrTimeout, 504},
		{domain.Errorf(domain.CodeCancelled, "the caller left"), 499},
		{domain.Errorf(domain.CodeResultTooLarge, "node sent too much"), 502},
		{domain.ErrConfig, 422},
		{fmt.Errorf("select run x: %w", domain.ErrRunNotFound), 404},
		{domain.Errorf(domain.CodeAtCapacity, "adapter exec is full"), 429},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), 504},
		{errors.New("boom"), 500},
	}
	for _, tt := range tests {
		if got := statusFor(tt.err); got != tt.want {
			t.Errorf("statusFor(%v) = %d, want %d", tt.err, got, tt.want)
		}
	}
}

func TestWriteError(t *testing.T) {
	w := httptest.NewRecorder()
	writeError(w, fmt.Errorf("cancel: %w", domain.Errorf(domain.CodeRunFinished, "run x has already finished")))
	if w.Code != 409 || w.Body.String() != `{"error":{"code":"run_finished","message":"run x has already finished"}}`+"\n" {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("content type %q", w.Header().Get("Content-Type"))
	}
	// An internal error's text stays in the log: the caller gets a generic
	// message, the access log's writer the detail.
	rec := httptest.NewRecorder()
	sw := &statusWriter{ResponseWriter: rec}
	writeError(sw, errors.New("SQL logic error: unrecognized token"))
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "SQL") || !strings.Contains(rec.Body.String(), `"code":"internal"`) {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if sw.internal == nil || !strings.Contains(sw.internal.Error(), "SQL logic error") {
		t.Fatalf("detail not handed to the log: %v", sw.internal)
	}
}

func TestMalformedMetadataStaysValidJSON(t *testing.T) {
	got := toRunEventJSON("n", domain.RunEvent{Type: domain.EventMetadata, Metadata: []byte("not json")})
	if string(got.Metadata) != `"not json"` {
		t.Fatalf("metadata %s", got.Metadata)
	}
}

// TestRunEventJSONAsMarshal checks the reflection-free formatting of run
// events against json.Marshal of the same event, byte for byte.
func TestRunEventJSONAsMarshal(t *testing.T) {
	text := "plain, \"quoted\" \\ <b>&amp;</b>\n\r\t\b\f\x00\x1f\x7f é 漢字 \u2028\u2029 bad:\xff\xc3 end"
	events := []domain.RunEvent{
		{RunID: "run_1", Seq: 1, Type: domain.EventStart},
		{RunID: "run_1", Seq: 2, Type: domain.EventDelta, Text: "hello load\n"},
		{Type: domain.EventDelta, Text: text},
		{RunID: text, Seq: 1 << 63, Type: domain.EventType(text), Text: text},
		{RunID: "run_1", Seq: 3, Type: domain.EventComplete, Usage: &domain.Usage{}},
		{RunID: "run_1", Seq: 3, Type: domain.EventComplete, Usage: &domain.Usage{DurationMS: 12}},
		{RunID: "run_1", Seq: 3, Type: domain.EventComplete, Usage: &domain.Usage{PromptTokens: 1, CompletionTokens: 2,
			TotalTokens: 3, DurationMS: 4, StopReason: "end_turn", Model: text}},
		{RunID: "run_1", Seq: 3, Type: domain.EventComplete, Usage: &domain.Usage{Model: "m", CostUSD: 0.0000001}},
		{RunID: "run_1", Seq: 4, Type: domain.EventError, Error: &domain.ErrorInfo{Code: "node_disconnected", Message: text}},
		{RunID: "run_1", Seq: 4, Type: domain.EventError, Error: &domain.ErrorInfo{}},
		{RunID: "run_1", Seq: 5, Type: domain.EventMetadata, Metadata: []byte(`{ "a" : "<x>" }`)},
		{RunID: "run_1", Seq: 5, Type: domain.EventMetadata, Metadata: []byte("not json")},
	}
	for _, node := range []string{"n1", "", text} {
		for i, ev := range events {
			want, err := json.Marshal(toRunEventJSON(node, ev))
			if err != nil {
				t.Fatal(err)
			}
			got, err := appendRunEventJSON([]byte("prefix"), node, ev)
			if err != nil || string(got) != "prefix"+string(want) {
				t.Errorf("event %d, node %q: got %s (%v)\nwant prefix%s", i, node, got, err, want)
			}
		}
	}
}

func TestSSEFraming(t *testing.T) {
	w := httptest.NewRecorder()
	s, err := (&Server{WriteIdleTimeout: time.Second}).startSSE(w, map[string]string{"X-IOP-Run-ID": "run_1"})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.event("progress", []byte("{\"a\":1,\r\n\"b\":2}\n"))
	_ = s.keepAlive()
	_ = s.event("bad\ntype", []byte(`{}`))
	_ = s.eventJSON("delta", map[string]string{"text": "<b>\n"}) // json.Marshal's bytes
	// A lone CR ends a line for an SSE reader: sent raw, the reader
	// would cut the JSON there.
	_ = s.event("progress", []byte("{\"status\":\"pulling\",\r\"pct\":1,\r\r\n\"x\":2}"))
	want := "event: progress\ndata: {\"a\":1,\ndata: \"b\":2}\n\n: keep-alive\n\nevent: bad type\ndata: {}\n\n" +
		"event: delta\ndata: {\"text\":\"\\u003cb\\u003e\\n\"}\n\n" +
		"event: progress\ndata: {\"status\":\"pulling\",\ndata: \"pct\":1,\ndata: \ndata: \"x\":2}\n\n"
	if w.Body.String() != want {
		t.Fatalf("body %q, want %q", w.Body.String(), want)
	}
	if w.Header().Get("X-IOP-Run-ID") != "run_1" || w.Header().Get("Content-Type") != "text/event-stream" || !w.Flushed {
		t.Fatalf("headers %v flushed %v", w.Header(), w.Flushed)
	}
}

// BenchmarkRunEventSSE is the edge's formatting of one run event for the
// caller's stream (a delta, as most of a run's events are).
func BenchmarkRunEventSSE(b *testing.B) {
	w := httptest.NewRecorder()
	s, err := (&Server{WriteIdleTimeout: time.Minute}).startSSE(w, nil)
	if err != nil {
		b.Fatal(err)
	}
	ev := domain.RunEvent{RunID: "run_5f0c0a1b2c3d4e5f60718293", Seq: 2, Type: domain.EventDelta, Text: "hello load\n"}
	b.ReportAllocs()
	for b.Loop() {
		w.Body.Reset()
		if err := s.writeRunEvent("n1", ev); err != nil {
			b.Fatal(err)
		}
		if err := s.flush(); err != nil {
			b.Fatal(err)
		}
	}
}
