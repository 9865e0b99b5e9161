package node_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

func TestExecuteRun(t *testing.T) {
	usage := &domain.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}
	tests := []struct {
		name       string
		req        domain.RunRequest
		script     ucExecFunc
		wantTypes  []domain.EventType
		wantTexts  []string
		wantCode   string // of the terminal error event
		wantMsg    string
		wantStatus domain.RunStatus // "" means not stored
		wantUsage  *domain.Usage
	}{
		{name: "adapter's own complete with usage",
			script:    ucEmit(nil, ucDelta("he"), domain.RunEvent{Type: domain.EventReasoningDelta, Text: "hmm"}, ucDelta("llo"), ucComplete(usage)),
			wantTypes: []domain.EventType{domain.EventStart, domain.EventDelta, domain.EventReasoningDelta, domain.EventDelta, domain.EventComplete},
			wantTexts: []string{"he", "llo"}, wantStatus: domain.RunSucceeded, wantUsage: usage},
		{name: "nil without a terminal is completed",
			script:    ucEmit(nil, ucDelta("x")),
			wantTypes: []domain.EventType{domain.EventStart, domain.EventDelta, domain.EventComplete},
			wantTexts: []string{"x"}, wantStatus: domain.RunSucceeded},
		{name: "an error without a terminal is run_failed",
			script:    ucEmit(errors.New("exit status 3: boom"), ucDelta("x")),
			wantTypes: []domain.EventType{domain.EventStart, domain.EventDelta, domain.EventError},
			wantCode:  domain.CodeRunFailed, wantMsg: "exit status 3: boom", wantStatus: domain.RunFailed},
		{name: "a domain error keeps its code",
			script:    ucEmit(fmt.Errorf("exec: %w", domain.Errorf(domain.CodeTargetNotFound, "no target %q", "nope"))),
			wantTypes: []domain.EventType{domain.EventStart, domain.EventError},
			wantCode:  domain.CodeTargetNotFound, wantMsg: `no target "nope"`, wantStatus: domain.RunFailed},
		{name: "the adapter's error event wins over its return value",
			script:    ucEmit(errors.New("ignored"), domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "upstream_500", Message: "bad gateway"}}),
			wantTypes: []domain.EventType{domain.EventStart, domain.EventError},
			wantCode:  "upstream_500", wantMsg: "bad gateway", wantStatus: domain.RunFailed},
		{name: "events after the terminal are dropped",
			script: ucEmit(nil, ucDelta("kept"), ucComplete(usage), ucDelta("late"),
				domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "late"}}, ucComplete(nil)),
			wantTypes: []domain.EventType{domain.EventStart, domain.EventDelta, domain.EventComplete},
			wantTexts: []string{"kept"}, wantStatus: domain.RunSucceeded, wantUsage: usage},
		{name: "the adapter's own start is not repeated",
			script:     ucEmit(nil, domain.RunEvent{Type: domain.EventStart}, ucDelta("x")),
			wantTypes:  []domain.EventType{domain.EventStart, domain.EventDelta, domain.EventComplete},
			wantStatus: domain.RunSucceeded},
		{name: "unknown adapter is one error event",
			req:       ucReq("r1", "nope", "t"),
			wantTypes: []domain.EventType{domain.EventError},
			wantCode:  domain.CodeAdapterNotFound, wantStatus: domain.RunFailed},
		{name: "a request without an adapter is refused",
			req:       ucReq("r1", "", "t"),
			wantTypes: []domain.EventType{domain.EventError},
			wantCode:  domain.CodeInvalidRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 2}, map[string]ucExecFunc{"": tc.script})
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
			req := tc.req
			if req.RunID == "" {
				req = ucReq("r1", "a", "t")
			}
			req.SessionID = "s1"
			evs := n.run(t, req)
			term := ucCheckStream(t, "r1", evs)
			var types []domain.EventType
			for _, ev := range evs {
				types = append(types, ev.Type)
			}
			if !slices.Equal(types, tc.wantTypes) {
				t.Fatalf("events = %s, want %v", ucTypes(evs), tc.wantTypes)
			}
			if tc.wantTexts != nil && !slices.Equal(ucTexts(evs), tc.wantTexts) {
				t.Fatalf("delta texts = %q, want %q", ucTexts(evs), tc.wantTexts)
			}
			if tc.wantCode != "" {
				if term.Error == nil || term.Error.Code != tc.wantCode || (tc.wantMsg != "" && term.Error.Message != tc.wantMsg) {
					t.Fatalf("terminal error = %+v, want %s %q", term.Error, tc.wantCode, tc.wantMsg)
				}
			}
			if (term.Usage == nil) != (tc.wantUsage == nil) || (tc.wantUsage != nil && *term.Usage != *tc.wantUsage) {
				t.Fatalf("terminal usage = %+v, want %+v", term.Usage, tc.wantUsage)
			}
			if errs := a.emitErrors(); len(errs) != 0 {
				t.Fatalf("Emit failed for the adapter: %v", errs)
			}
			r, err := n.store.GetRun(context.Background(), "r1")
			if tc.wantStatus == "" {
				if !errors.Is(err, domain.ErrRunNotFound) {
					t.Fatalf("store has the run: %v, %v", r, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := r.Snapshot()
			if s.Status != tc.wantStatus || s.Adapter != req.Adapter || s.Target != "t" || s.SessionID != "s1" || s.FinishedAt.IsZero() || s.CreatedAt.IsZero() {
				t.Fatalf("stored run = %+v, want status %s", s, tc.wantStatus)
			}
			if tc.wantCode != "" && (s.ErrorCode != tc.wantCode || (tc.wantMsg != "" && s.ErrorMessage != tc.wantMsg)) {
				t.Fatalf("stored error = %q %q, want %q %q", s.ErrorCode, s.ErrorMessage, tc.wantCode, tc.wantMsg)
			}
			if (s.Usage == nil) != (tc.wantUsage == nil) || (tc.wantUsage != nil && *s.Usage != *tc.wantUsage) {
				t.Fatalf("stored usage = %+v, want %+v", s.Usage, tc.wantUsage)
			}
		})
	}
}

func TestExecuteRunAtCapacity(t *testing.T) {
	ucNoLeaks(t)
	gate := make(chan struct{})
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
		"slow": ucGate(gate, nil, ucDelta("done")),
		"":     ucEmit(nil, ucDelta("fast")),
	})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	first := n.start(ucReq("r1", "a", "slow"))
	a.waitStarted(t, "r1")
	if st := n.rt.Statuses(); st[0].InFlight != 1 || st[0].MaxConcurrency != 1 {
		t.Fatalf("statuses = %+v, want a at 1 of 1", st)
	}

	evs := n.run(t, ucReq("r2", "a", ""))
	term := ucCheckStream(t, "r2", evs)
	if len(evs) != 1 || term.Type != domain.EventError || term.Error.Code != domain.CodeAtCapacity {
		t.Fatalf("second run = %s, want a single at_capacity error", ucTypes(evs))
	}
	if slices.Contains(a.ranRuns(), "r2") {
		t.Fatal("the refused run reached the adapter")
	}
	if s := n.stored(t, "r2"); s.Status != domain.RunFailed || s.ErrorCode != domain.CodeAtCapacity {
		t.Fatalf("refused run stored as %+v", s)
	}

	close(gate)
	if term := ucCheckStream(t, "r1", first.waitClosed(t)); term.Type != domain.EventComplete {
		t.Fatalf("first run ended with %s", term.Type)
	}
	// The slot is free as soon as the terminal event is out.
	evs = n.run(t, ucReq("r3", "a", ""))
	if term := ucCheckStream(t, "r3", evs); term.Type != domain.EventComplete {
		t.Fatalf("run after the first finished = %s, want complete", ucTypes(evs))
	}
}

func TestExecuteRunSessionBusy(t *testing.T) {
	tests := []struct {
		name     string
		adapter  string
		session  string
		wantCode string // "" means it runs
	}{
		{name: "same adapter and session", adapter: "a", session: "s1", wantCode: domain.CodeSessionBusy},
		{name: "same adapter, other session", adapter: "a", session: "s2"},
		{name: "same adapter, no session", adapter: "a", session: ""},
		{name: "other adapter, same session", adapter: "b", session: "s1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			gate := make(chan struct{})
			script := map[string]ucExecFunc{"slow": ucGate(gate, nil), "": ucEmit(nil, ucDelta("x"))}
			a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 4, Sessions: true}, script)
			b := newUCAdapter("b", domain.Capabilities{MaxConcurrency: 4, Sessions: true}, script)
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a, "b": b})
			first := ucReq("r1", "a", "slow")
			first.SessionID = "s1"
			firstOut := n.start(first)
			a.waitStarted(t, "r1")

			second := ucReq("r2", tc.adapter, "")
			second.SessionID = tc.session
			evs := n.run(t, second)
			term := ucCheckStream(t, "r2", evs)
			if tc.wantCode != "" {
				if len(evs) != 1 || term.Error == nil || term.Error.Code != tc.wantCode {
					t.Fatalf("second run = %s, want a single %s error", ucTypes(evs), tc.wantCode)
				}
			} else if term.Type != domain.EventComplete {
				t.Fatalf("second run = %s, want complete", ucTypes(evs))
			}
			close(gate)
			firstOut.waitClosed(t)
			// Once the first run is over, the session is free again.
			third := ucReq("r3", "a", "")
			third.SessionID = "s1"
			if term := ucCheckStream(t, "r3", n.run(t, third)); term.Type != domain.EventComplete {
				t.Fatalf("run after the session freed up ended %s", term.Type)
			}
		})
	}
}

func TestExecuteRunSplitsLongText(t *testing.T) {
	ucNoLeaks(t)
	// 4 runes of 1, 2, 3 and 4 bytes, so a 16 KiB cut lands inside runes.
	text := strings.Repeat("aé€😀", 5000) // 50,000 bytes
	usage := &domain.Usage{TotalTokens: 9}
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
		"": ucEmit(nil, domain.RunEvent{Type: domain.EventDelta, Text: text, Usage: usage}, ucDelta("tail")),
	})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	evs := n.run(t, ucReq("r1", "a", ""))
	ucCheckStream(t, "r1", evs)
	pieces := evs[1 : len(evs)-2] // between start and the "tail" delta
	if len(pieces) < 4 {
		t.Fatalf("%d bytes came in %d events, want at least 4", len(text), len(pieces))
	}
	var joined strings.Builder
	for i, p := range pieces {
		if p.Type != domain.EventDelta || len(p.Text) > node.MaxEventText || len(p.Text) == 0 || !utf8.ValidString(p.Text) {
			t.Fatalf("piece %d: type %s, %d bytes, valid UTF-8 %v", i, p.Type, len(p.Text), utf8.ValidString(p.Text))
		}
		if (p.Usage != nil) != (i == len(pieces)-1) {
			t.Fatalf("piece %d carries usage %v; only the last piece should", i, p.Usage)
		}
		joined.WriteString(p.Text)
	}
	if joined.String() != text {
		t.Fatal("the pieces do not concatenate back to the text")
	}
	if evs[len(evs)-2].Text != "tail" {
		t.Fatalf("short delta after the long one = %q", evs[len(evs)-2].Text)
	}
}

func TestExecuteRunCallerLeaves(t *testing.T) {
	tests := []struct {
		name       string
		background bool
		// failAfterDone: the output refuses events once the caller left.
		failAfterDone bool
		wantStatus    domain.RunStatus
		wantTerminal  domain.EventType // seen on the output; "" for none
		wantEmitErrs  bool             // the adapter saw Emit fail
	}{
		{name: "foreground run is cancelled", wantStatus: domain.RunCancelled, wantTerminal: domain.EventCancelled},
		{name: "foreground run is cancelled even if the output is gone", failAfterDone: true, wantStatus: domain.RunCancelled},
		{name: "background run keeps going", background: true, failAfterDone: true, wantStatus: domain.RunSucceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			gate := make(chan struct{})
			a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
				"": ucGate(gate, []domain.RunEvent{ucDelta("before")}, ucDelta("after-1"), ucDelta("after-2"), ucComplete(&domain.Usage{TotalTokens: 1})),
			})
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
			req := ucReq("r1", "a", "")
			req.Background = tc.background
			out := newUCOutput()
			out.failAfterDone = tc.failAfterDone
			go n.runs.ExecuteRun(req, out)
			out.wait(t, "the first delta", func(evs []domain.RunEvent) bool { return len(evs) == 2 })

			out.leave()
			if tc.background {
				// Nothing to wait for when proving an absence: give a wrong
				// cancel a moment to show, then let the run carry on.
				select {
				case <-out.closed:
					t.Fatalf("background run ended when its caller left: %s", ucTypes(out.all()))
				case <-time.After(50 * time.Millisecond):
				}
				close(gate)
			}
			evs := out.waitClosed(t)
			var last domain.EventType
			if len(evs) > 0 {
				last = evs[len(evs)-1].Type
			}
			switch {
			case tc.wantTerminal != "":
				if ucCheckStream(t, "r1", evs).Type != tc.wantTerminal {
					t.Fatalf("output got %s, want it to end with %s", ucTypes(evs), tc.wantTerminal)
				}
			case last.Terminal():
				t.Fatalf("a gone output received %s", ucTypes(evs))
			}
			if got := len(a.emitErrors()) > 0; got != tc.wantEmitErrs {
				t.Fatalf("adapter saw Emit errors %v, want %v", a.emitErrors(), tc.wantEmitErrs)
			}
			s := n.stored(t, "r1")
			if s.Status != tc.wantStatus || s.Background != tc.background {
				t.Fatalf("stored run = %+v, want %s", s, tc.wantStatus)
			}
			if tc.wantStatus == domain.RunCancelled && s.ErrorCode != domain.CodeCancelled {
				t.Fatalf("stored error code = %q, want cancelled", s.ErrorCode)
			}
			if tc.wantStatus == domain.RunSucceeded && (s.Usage == nil || s.Usage.TotalTokens != 1) {
				t.Fatalf("stored usage = %+v", s.Usage)
			}
		})
	}
}

// TestExecuteRunCallerLeavesWhileStreaming has the caller leave while the
// adapter is emitting as fast as it can and returns Emit's error: however
// the adapter's return and the departure race, the run is recorded as
// cancelled (the caller left), not failed.
func TestExecuteRunCallerLeavesWhileStreaming(t *testing.T) {
	ucNoLeaks(t)
	a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{
		"": func(ctx context.Context, _ domain.RunRequest, sink ports.EventSink) error {
			for {
				if err := sink.Emit(ucDelta("tok")); err != nil {
					return fmt.Errorf("write output: %w", err)
				}
				if ctx.Err() != nil {
					return ctx.Err()
				}
			}
		},
	})
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
	for i := range 100 {
		id := fmt.Sprintf("r%d", i)
		out := newUCOutput()
		out.failAfterDone = true
		go n.runs.ExecuteRun(ucReq(id, "a", ""), out)
		out.wait(t, "a few deltas", func(evs []domain.RunEvent) bool { return len(evs) >= 3 })
		out.leave()
		out.waitClosed(t)
		if s := n.stored(t, id); s.Status != domain.RunCancelled || s.ErrorCode != domain.CodeCancelled {
			t.Fatalf("iteration %d: stored %s (%s: %s), want cancelled", i, s.Status, s.ErrorCode, s.ErrorMessage)
		}
	}
}

// Event text and error messages reach the link and the store as valid
// UTF-8 whatever the adapter relays (a process printing Latin-1, a
// multi-byte character cut in two): both are protobuf strings on the link,
// and a frame that is not UTF-8 cannot be sent.
func TestExecuteRunMakesTextAndErrorsValidUTF8(t *testing.T) {
	// Each lone invalid byte becomes U+FFFD, three bytes: the text grows
	// past MaxEventText and must still be split into pieces within it.
	long := strings.Repeat("\xe9a", node.MaxEventText/2)
	tests := []struct {
		name      string
		script    ucExecFunc
		wantTexts []string
		wantMsg   string
	}{
		{name: "delta text and a returned error",
			script:    ucEmit(errors.New("exit status 1: caf\xe9"), ucDelta("caf\xe9")),
			wantTexts: []string{"caf\uFFFD"}, wantMsg: "exit status 1: caf\uFFFD"},
		{name: "the adapter's own error event",
			script:  ucEmit(nil, domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "upstream_500", Message: "bad \xff\xfe gateway"}}),
			wantMsg: "bad \uFFFD gateway"},
		{name: "long text is split after it is made valid",
			script:    ucEmit(nil, ucDelta(long)),
			wantTexts: []string{strings.Repeat("\uFFFDa", node.MaxEventText/2)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": tc.script})
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
			evs := n.run(t, ucReq("r1", "a", "t"))
			term := ucCheckStream(t, "r1", evs)
			for _, ev := range evs {
				if !utf8.ValidString(ev.Text) || (ev.Error != nil && !utf8.ValidString(ev.Error.Message)) {
					t.Fatalf("event %d is not valid UTF-8: %+v", ev.Seq, ev)
				}
				if len(ev.Text) > node.MaxEventText {
					t.Fatalf("event %d carries %d bytes of text, over %d", ev.Seq, len(ev.Text), node.MaxEventText)
				}
			}
			if got, want := strings.Join(ucTexts(evs), ""), strings.Join(tc.wantTexts, ""); got != want {
				t.Fatalf("delta text (%d bytes) = %.64q…, want %.64q… (%d bytes)", len(got), got, want, len(want))
			}
			if tc.wantMsg != "" {
				if term.Error == nil || term.Error.Message != tc.wantMsg {
					t.Fatalf("terminal = %+v, want message %q", term.Error, tc.wantMsg)
				}
				if s := n.stored(t, "r1"); s.ErrorMessage != tc.wantMsg {
					t.Fatalf("stored message %q, want %q", s.ErrorMessage, tc.wantMsg)
				}
			}
		})
	}
}

// An upstream error message of megabytes (an error page, a dump) reaches
// the caller and the store cut to MaxErrorMessage, at a character
// boundary and marked: stored whole, a few such runs made the runs
// command's answer larger than the edge accepts.
func TestExecuteRunCutsLongErrorMessages(t *testing.T) {
	huge := "x" + strings.Repeat("é", 3<<20/2) // two-byte characters, after one byte: a cut may fall inside one
	mark := fmt.Sprintf("… (%d bytes in all)", len(huge))
	for _, tc := range []struct {
		name   string
		script ucExecFunc
	}{
		{"the adapter's own error event", ucEmit(nil, domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: domain.CodeProviderError, Message: huge}})},
		{"a returned error", ucEmit(errors.New(huge))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			a := newUCAdapter("a", domain.Capabilities{MaxConcurrency: 1}, map[string]ucExecFunc{"": tc.script})
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"a": a})
			term := ucCheckStream(t, "r1", n.run(t, ucReq("r1", "a", "t")))
			stored := n.stored(t, "r1").ErrorMessage
			for what, msg := range map[string]string{"sent": term.Error.Message, "stored": stored} {
				if len(msg) > node.MaxErrorMessage || !utf8.ValidString(msg) || !strings.HasSuffix(msg, mark) ||
					!strings.HasPrefix(huge, strings.TrimSuffix(msg, mark)) || len(msg) < node.MaxErrorMessage-len(mark) {
					t.Fatalf("%s message: %d bytes, valid UTF-8 %v, ends %q; want at most %d bytes of the head, marked %q",
						what, len(msg), utf8.ValidString(msg), msg[max(0, len(msg)-40):], node.MaxErrorMessage, mark)
				}
			}
		})
	}
}
