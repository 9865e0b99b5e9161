package node_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"iop/application/node"
	"iop/domain"
	"iop/ports"
)

func TestTerminateSession(t *testing.T) {
	errGone := errors.New("session store unavailable")
	tests := []struct {
		name    string
		adapter string
		termErr error
		wantErr error
		// wantTerminated: the chat adapter's terminator was called for t/s1,
		// and the run in flight in s1 was cancelled.
		wantTerminated bool
	}{
		{name: "session-keeping adapter", adapter: "chat", wantTerminated: true},
		{name: "terminator failure is reported", adapter: "chat", termErr: errGone, wantErr: errGone, wantTerminated: true},
		{name: "adapter without sessions", adapter: "plain", wantErr: domain.ErrSessionUnsupported},
		{name: "terminator that does not declare sessions", adapter: "quiet", wantErr: domain.ErrSessionUnsupported},
		{name: "unknown adapter", adapter: "nope", wantErr: domain.ErrAdapterNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ucNoLeaks(t)
			script := map[string]ucExecFunc{"": ucBlock(ucDelta("thinking"))}
			chat := &ucSessionAdapter{ucAdapter: newUCAdapter("chat", domain.Capabilities{MaxConcurrency: 4, Sessions: true}, script), termErr: tc.termErr}
			quiet := &ucSessionAdapter{ucAdapter: newUCAdapter("quiet", domain.Capabilities{MaxConcurrency: 4}, script)}
			plain := newUCAdapter("plain", domain.Capabilities{MaxConcurrency: 4}, script)
			n := newUCNode(t, map[string]ports.RuntimeAdapter{"chat": chat, "quiet": quiet, "plain": plain})
			sessions := node.NewSessionHandler(n.rt, n.runs)

			// Runs in flight: one in s1 and one in s2 on each adapter.
			outs := map[string]*ucOutput{}
			for _, ad := range []string{"chat", "quiet", "plain"} {
				for _, s := range []string{"s1", "s2"} {
					req := ucReq(ad+"-"+s, ad, "t")
					req.SessionID = s
					outs[req.RunID] = n.start(req)
					outs[req.RunID].wait(t, req.RunID+" to start", func(evs []domain.RunEvent) bool { return len(evs) == 2 })
				}
			}

			err := sessions.TerminateSession(context.Background(), tc.adapter, "t", "s1")
			if (err == nil) != (tc.wantErr == nil) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Fatalf("TerminateSession = %v, want %v", err, tc.wantErr)
			}
			wantCalls := []string(nil)
			if tc.wantTerminated {
				wantCalls = []string{"t/s1"}
			}
			if got := chat.terminations(); !slices.Equal(got, wantCalls) {
				t.Fatalf("chat terminator calls = %v, want %v", got, wantCalls)
			}
			if got := quiet.terminations(); len(got) != 0 {
				t.Fatalf("quiet terminator called: %v", got)
			}
			if tc.wantTerminated {
				evs := outs["chat-s1"].waitClosed(t)
				term := ucCheckStream(t, "chat-s1", evs)
				if term.Type != domain.EventCancelled {
					t.Fatalf("run in the terminated session ended %s, want cancelled", ucTypes(evs))
				}
				if s := n.stored(t, "chat-s1"); s.Status != domain.RunCancelled {
					t.Fatalf("stored %s, want cancelled", s.Status)
				}
			}
			// Every other run is still going.
			for id, out := range outs {
				if tc.wantTerminated && id == "chat-s1" {
					continue
				}
				select {
				case <-out.closed:
					t.Fatalf("run %s ended: %s", id, ucTypes(out.all()))
				default:
				}
			}
		})
	}
}

// TestTerminateUnknownSession: a session the adapter does not keep is
// session_not_found (a typo must not read as ended), unless a run in
// flight uses it (its first turn, not stored yet): that run is stopped
// and the session ended.
func TestTerminateUnknownSession(t *testing.T) {
	ucNoLeaks(t)
	chat := &ucSessionAdapter{
		ucAdapter: newUCAdapter("chat", domain.Capabilities{MaxConcurrency: 4, Sessions: true}, map[string]ucExecFunc{"": ucBlock(ucDelta("thinking"))}),
		stored:    map[string]bool{"kept": true},
	}
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"chat": chat})
	sessions := node.NewSessionHandler(n.rt, n.runs)
	ctx := context.Background()

	err := sessions.TerminateSession(ctx, "chat", "t", "typo")
	if !errors.Is(err, domain.ErrSessionNotFound) || !strings.Contains(err.Error(), `"typo"`) {
		t.Fatalf("ending an unknown session = %v, want session_not_found naming it", err)
	}
	if err := sessions.TerminateSession(ctx, "chat", "t", "kept"); err != nil {
		t.Fatalf("ending a stored session = %v", err)
	}
	if err := sessions.TerminateSession(ctx, "chat", "t", "kept"); !errors.Is(err, domain.ErrSessionNotFound) {
		t.Fatalf("ending it again = %v, want session_not_found", err)
	}

	req := ucReq("r1", "chat", "t")
	req.SessionID = "fresh"
	out := n.start(req)
	out.wait(t, "the run to start", func(evs []domain.RunEvent) bool { return len(evs) == 2 })
	if err := sessions.TerminateSession(ctx, "chat", "t", "fresh"); err != nil {
		t.Fatalf("ending a session whose first run is in flight = %v", err)
	}
	if term := ucCheckStream(t, "r1", out.waitClosed(t)); term.Type != domain.EventCancelled {
		t.Fatalf("run ended %s, want cancelled", term.Type)
	}
	if err := sessions.TerminateSession(ctx, "chat", "t", "fresh"); !errors.Is(err, domain.ErrSessionNotFound) {
		t.Fatalf("ending it again = %v, want session_not_found", err)
	}
}

func TestListSessionsNamesTheConfiguredAdapter(t *testing.T) {
	chat := &ucSessionAdapter{
		ucAdapter: newUCAdapter("chat", domain.Capabilities{MaxConcurrency: 1, Sessions: true}, nil),
		sessions:  []domain.SessionInfo{{Adapter: "ollama", Target: "llama3", SessionID: "s1", Turns: 2}},
	}
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"mychat": chat, "plain": newUCAdapter("plain", domain.Capabilities{MaxConcurrency: 1}, nil)})
	got, more, err := node.NewSessionHandler(n.rt, n.runs).ListSessions(context.Background(), "", domain.SessionQuery{})
	if err != nil || more {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Adapter != "mychat" || got[0].SessionID != "s1" || got[0].Turns != 2 {
		t.Fatalf("sessions = %+v, want s1 of mychat", got)
	}
}

// ucOrderedSessionAdapter logs, in one shared order, when a run of its
// session stops and when the session is terminated.
type ucOrderedSessionAdapter struct {
	*ucSessionAdapter
	mu  sync.Mutex
	log []string
}

func (a *ucOrderedSessionAdapter) note(s string) {
	a.mu.Lock()
	a.log = append(a.log, s)
	a.mu.Unlock()
}

func (a *ucOrderedSessionAdapter) TerminateSession(ctx context.Context, target, sessionID string) error {
	a.note("terminated " + sessionID)
	return a.ucSessionAdapter.TerminateSession(ctx, target, sessionID)
}

// TestTerminateSessionWaitsForTheRunToStop checks that the session is
// forgotten only after the run in flight in it has stopped, so a run that
// saves its history on the way out cannot bring the session back.
func TestTerminateSessionWaitsForTheRunToStop(t *testing.T) {
	ucNoLeaks(t)
	a := &ucOrderedSessionAdapter{}
	a.ucSessionAdapter = &ucSessionAdapter{ucAdapter: newUCAdapter("chat", domain.Capabilities{MaxConcurrency: 1, Sessions: true}, map[string]ucExecFunc{
		"": func(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
			_ = sink.Emit(ucDelta("partial"))
			<-ctx.Done()
			time.Sleep(20 * time.Millisecond) // saving the partial turn takes a while
			a.note("run stopped " + req.SessionID)
			return ctx.Err()
		},
		"quick": ucEmit(nil, ucDelta("fresh")),
	})}
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"chat": a})
	req := ucReq("r1", "chat", "t")
	req.SessionID = "s1"
	out := n.start(req)
	out.wait(t, "the run to start", func(evs []domain.RunEvent) bool { return len(evs) == 2 })

	if err := node.NewSessionHandler(n.rt, n.runs).TerminateSession(context.Background(), "chat", "t", "s1"); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	got := slices.Clone(a.log)
	a.mu.Unlock()
	if !slices.Equal(got, []string{"run stopped s1", "terminated s1"}) {
		t.Fatalf("order = %v, want the run stopped before the session was terminated", got)
	}
	// The session and the adapter's only slot are free once it returns.
	next := ucReq("r2", "chat", "quick")
	next.SessionID = "s1"
	if evs := n.run(t, next); ucCheckStream(t, "r2", evs).Type != domain.EventComplete {
		t.Fatalf("run right after the termination = %s, want complete", ucTypes(evs))
	}
	if term := ucCheckStream(t, "r1", out.waitClosed(t)); term.Type != domain.EventCancelled {
		t.Fatalf("run ended %s, want cancelled", term.Type)
	}
}

// ucBlockingSessionAdapter's TerminateSession waits for release, so a test
// can act while the adapter is forgetting a session.
type ucBlockingSessionAdapter struct {
	*ucSessionAdapter
	entered chan struct{}
	release chan struct{}
}

func (a *ucBlockingSessionAdapter) TerminateSession(ctx context.Context, target, sessionID string) error {
	close(a.entered)
	<-a.release
	return a.ucSessionAdapter.TerminateSession(ctx, target, sessionID)
}

// TestSessionRunWhileTheSessionIsBeingEnded: a run of a session that
// arrives while its adapter forgets the session is refused as busy (it
// would use, and write back, a session being deleted); once the
// termination returns, the session takes runs again.
func TestSessionRunWhileTheSessionIsBeingEnded(t *testing.T) {
	ucNoLeaks(t)
	a := &ucBlockingSessionAdapter{entered: make(chan struct{}), release: make(chan struct{})}
	a.ucSessionAdapter = &ucSessionAdapter{ucAdapter: newUCAdapter("chat", domain.Capabilities{MaxConcurrency: 2, Sessions: true}, map[string]ucExecFunc{
		"quick": ucEmit(nil, ucDelta("fresh")),
	})}
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"chat": a})
	done := make(chan error, 1)
	go func() {
		done <- node.NewSessionHandler(n.rt, n.runs).TerminateSession(context.Background(), "chat", "quick", "s1")
	}()
	<-a.entered
	during := ucReq("r1", "chat", "quick")
	during.SessionID = "s1"
	evs := n.run(t, during)
	if term := ucCheckStream(t, "r1", evs); term.Type != domain.EventError || term.Error == nil || term.Error.Code != domain.CodeSessionBusy {
		t.Fatalf("a run while the session is being ended = %s, want error session_busy", ucTypes(evs))
	}
	close(a.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	after := ucReq("r2", "chat", "quick")
	after.SessionID = "s1"
	if evs := n.run(t, after); ucCheckStream(t, "r2", evs).Type != domain.EventComplete {
		t.Fatalf("a run after the termination = %s, want complete", ucTypes(evs))
	}
}
