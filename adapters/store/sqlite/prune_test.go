package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"iop/adapters/store/sqlite"
	"iop/domain"
	"iop/internal/lockedbuf"
)

// stores opens a fresh database of each kind the node's SQL must work on.
var stores = map[string]func(t *testing.T) *sqlite.DB{
	"sqlite":   func(t *testing.T) *sqlite.DB { return open(t, fileDSN(t)) },
	"postgres": openPostgres,
}

// addRun stores a run of adapter in session created at created; a non-zero
// finished finishes it (status by how), a started one starts it.
func addRun(t *testing.T, runs *sqlite.RunStore, id, adapter, session string, created, finished time.Time, how domain.EventType) {
	t.Helper()
	ctx := context.Background()
	r, err := domain.NewRun(domain.RunRequest{RunID: id, Adapter: adapter, Target: "m", SessionID: session}, created)
	if err != nil {
		t.Fatal(err)
	}
	if err := runs.CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	switch {
	case how == domain.EventStart:
		err = runs.UpdateRun(ctx, id, func(r *domain.Run) error { return r.Start(created.Add(time.Second)) })
	case !finished.IsZero():
		ev := domain.RunEvent{Type: how}
		if how == domain.EventError {
			ev.Error = &domain.ErrorInfo{Code: domain.CodeRunFailed, Message: "boom"}
		}
		err = runs.UpdateRun(ctx, id, func(r *domain.Run) error { return r.Finish(ev, finished) })
	}
	if err != nil {
		t.Fatal(err)
	}
}

func runIDs(t *testing.T, runs *sqlite.RunStore) []string {
	t.Helper()
	list, err := runs.ListRuns(context.Background(), domain.RunFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range list {
		ids = append(ids, r.ID())
	}
	slices.Sort(ids)
	return ids
}

func sessionIDs(t *testing.T, list []domain.SessionInfo, err error) []string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range list {
		ids = append(ids, s.Adapter+"/"+s.SessionID)
	}
	slices.Sort(ids)
	return ids
}

// Prune deletes finished runs that finished before the cutoff, and
// sessions idle since before it; runs in flight (and their sessions) and
// anything newer stay.
func TestPrune(t *testing.T) {
	for name, openDB := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t)
			runs, chats, agents := sqlite.NewRunStore(db), sqlite.NewChatStore(db), sqlite.NewAgentSessionStore(db)
			now := time.Now().UTC()
			cutoff := now.Add(-30 * 24 * time.Hour)
			old, recent := cutoff.Add(-time.Hour), cutoff.Add(time.Hour)

			addRun(t, runs, "old-succeeded", "exec", "", old, old.Add(time.Minute), domain.EventComplete)
			addRun(t, runs, "old-failed", "exec", "", old, old.Add(time.Minute), domain.EventError)
			addRun(t, runs, "old-cancelled", "exec", "", old, old.Add(time.Minute), domain.EventCancelled)
			addRun(t, runs, "old-queued", "exec", "", old, time.Time{}, "")
			addRun(t, runs, "old-running", "exec", "", old, time.Time{}, domain.EventStart)
			addRun(t, runs, "recent-succeeded", "exec", "", recent, recent.Add(time.Minute), domain.EventComplete)
			// Created long ago, finished lately: its end is recent.
			addRun(t, runs, "long-run", "exec", "", old.Add(-24*time.Hour), recent, domain.EventComplete)

			turn := []domain.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello", Reply: true}}
			for _, s := range []string{"idle", "active", "busy", "fresh"} {
				if err := chats.AppendChat(ctx, "ollama", "m", s, turn); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range []string{"idle", "active", "busy"} {
				if err := db.Backdate(ctx, "chat_messages", "created_at", "ollama", s, old); err != nil {
					t.Fatal(err)
				}
			}
			// active's newest turn is recent; busy has a run in flight.
			if err := chats.AppendChat(ctx, "ollama", "m", "active", turn[1:]); err != nil {
				t.Fatal(err)
			}
			addRun(t, runs, "busy-turn", "ollama", "busy", old, time.Time{}, domain.EventStart)
			// The same session id on another adapter is another session.
			if err := chats.AppendChat(ctx, "openai", "m", "idle", turn); err != nil {
				t.Fatal(err)
			}

			for _, s := range []string{"idle", "busy", "fresh"} {
				if err := agents.PutAgentSession(ctx, "codex", "t", s, "thread-"+s); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range []string{"idle", "busy"} {
				if err := db.Backdate(ctx, "agent_sessions", "updated_at", "codex", s, old); err != nil {
					t.Fatal(err)
				}
			}
			addRun(t, runs, "busy-agent", "codex", "busy", old, time.Time{}, "")

			res, err := db.Prune(ctx, cutoff)
			want := sqlite.PruneResult{Runs: 3, ChatSessions: 1, ChatMessages: 3, AgentSessions: 1}
			if err != nil || res != want {
				t.Fatalf("Prune = %+v, %v; want %+v", res, err, want)
			}
			if got, want := runIDs(t, runs), []string{"busy-agent", "busy-turn", "long-run", "old-queued", "old-running", "recent-succeeded"}; !slices.Equal(got, want) {
				t.Errorf("runs kept: %v, want %v", got, want)
			}
			if _, err := runs.GetRun(ctx, "old-failed"); !errors.Is(err, domain.ErrRunNotFound) {
				t.Errorf("GetRun of a pruned run: %v, want ErrRunNotFound", err)
			}
			list, err := chats.ListChats(ctx, "", domain.SessionQuery{})
			if got, want := sessionIDs(t, list, err), []string{"ollama/active", "ollama/busy", "ollama/fresh", "openai/idle"}; !slices.Equal(got, want) {
				t.Errorf("chat sessions kept: %v, want %v", got, want)
			}
			// A kept session keeps all of its history, old messages too.
			if msgs, err := chats.LoadChat(ctx, "ollama", "active", 0); err != nil || len(msgs) != 5 {
				t.Errorf("LoadChat(active) = %d messages, %v; want 5", len(msgs), err)
			}
			// The pruned session's next turn starts a new history.
			if err := chats.AppendChat(ctx, "ollama", "m", "idle", turn[1:]); err != nil {
				t.Fatal(err)
			}
			if msgs, err := chats.LoadChat(ctx, "ollama", "idle", 0); err != nil || !slices.Equal(msgs, turn[1:]) {
				t.Errorf("LoadChat(idle) after a new turn = %+v, %v; want only that turn", msgs, err)
			}
			list, err = agents.ListAgentSessions(ctx, "", domain.SessionQuery{})
			if got, want := sessionIDs(t, list, err), []string{"codex/busy", "codex/fresh"}; !slices.Equal(got, want) {
				t.Errorf("agent sessions kept: %v, want %v", got, want)
			}

			// Nothing left to prune: a second pass deletes nothing.
			if res, err := db.Prune(ctx, cutoff); err != nil || !res.Empty() {
				t.Fatalf("second Prune = %+v, %v; want nothing", res, err)
			}
		})
	}
}

// Prune deletes in chunks, each its own statement, so on SQLite's one
// connection runs and turns get their turns between them; chat sessions
// are read a page at a time, and a page of sessions that stay does not
// stop it.
func TestPruneDeletesInChunks(t *testing.T) {
	for name, openDB := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t)
			runs, chats, agents := sqlite.NewRunStore(db), sqlite.NewChatStore(db), sqlite.NewAgentSessionStore(db)
			old := time.Now().Add(-48 * time.Hour)
			cutoff := old.Add(time.Hour)
			for i := range 25 { // expired: 6 full chunks of 4 and one of 1
				addRun(t, runs, fmt.Sprintf("old%02d", i), "exec", "", old, old.Add(time.Second), domain.EventComplete)
			}
			addRun(t, runs, "live", "exec", "", old, time.Time{}, domain.EventStart)
			msg := []domain.ChatMessage{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello", Reply: true}}
			// Sessions a0…a9 in key order; every other one stays (recent).
			// With pages of 4 the expired ones span three pages, and the
			// second page starts with sessions that stay.
			for i := range 10 {
				s := fmt.Sprintf("a%d", i)
				n := 1
				if i == 1 {
					n = 5 // 10 messages: chunks of 4, 4 and 2
				}
				for range n {
					if err := chats.AppendChat(ctx, "ollama", "m", s, msg); err != nil {
						t.Fatal(err)
					}
				}
				if i%2 == 1 || i == 8 {
					if err := db.Backdate(ctx, "chat_messages", "created_at", "ollama", s, old); err != nil {
						t.Fatal(err)
					}
				}
			}
			for i := range 5 { // expired: a chunk of 4 and one of 1
				s := fmt.Sprintf("g%d", i)
				if err := agents.PutAgentSession(ctx, "codex", "t", s, "thread"); err != nil {
					t.Fatal(err)
				}
				if err := db.Backdate(ctx, "agent_sessions", "updated_at", "codex", s, old); err != nil {
					t.Fatal(err)
				}
			}

			deletes := db.CountDeletes()
			res, err := db.PruneChunks(ctx, cutoff, 4)
			want := sqlite.PruneResult{Runs: 25, ChatSessions: 6, ChatMessages: 20, AgentSessions: 5}
			if err != nil || res != want {
				t.Fatalf("PruneChunks = %+v, %v; want %+v", res, err, want)
			}
			// Runs 7; chat a1: 3, a3 a5 a7 a8 a9: 1 each, then each one's
			// summary, then one look for summaries left without messages;
			// agents 2.
			if got := deletes.Load(); got != 7+3+5+6+1+2 {
				t.Errorf("%d DELETE statements, want 24 (chunks of at most 4 rows)", got)
			}
			if got := runIDs(t, runs); !slices.Equal(got, []string{"live"}) {
				t.Errorf("runs kept: %v", got)
			}
			list, err := chats.ListChats(ctx, "", domain.SessionQuery{})
			if got, want := sessionIDs(t, list, err), []string{"ollama/a0", "ollama/a2", "ollama/a4", "ollama/a6"}; !slices.Equal(got, want) {
				t.Errorf("chat sessions kept: %v, want %v", got, want)
			}
		})
	}
}

// StartPruning prunes at once, logs one line for a pass that deleted
// something, and stops with StopPruning (and Close): goleak checks no
// goroutine is left. A negative retention keeps everything.
func TestStartPruning(t *testing.T) {
	ctx := context.Background()
	db := open(t, fileDSN(t))
	runs := sqlite.NewRunStore(db)
	old := time.Now().Add(-2 * time.Hour)
	addRun(t, runs, "old", "exec", "", old, old.Add(time.Second), domain.EventComplete)
	addRun(t, runs, "new", "exec", "", time.Now(), time.Now(), domain.EventComplete)

	var logs lockedbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	db.StartPruning(-1, time.Millisecond, log)
	time.Sleep(50 * time.Millisecond)
	db.StopPruning()
	if got := runIDs(t, runs); !slices.Equal(got, []string{"new", "old"}) {
		t.Fatalf("a negative retention pruned: kept %v", got)
	}

	// The first pass is at start, not an interval later.
	db.StartPruning(time.Hour, time.Hour, log)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "node store pruned") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	db.StopPruning()
	if got := runIDs(t, runs); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("kept %v, want the recent run only", got)
	}
	// Passes that delete nothing log nothing.
	db.StartPruning(time.Hour, time.Millisecond, log)
	time.Sleep(50 * time.Millisecond)
	db.StopPruning()
	if _, err := runs.GetRun(ctx, "new"); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, "node store pruned"); n != 1 || !strings.Contains(out, "runs=1 ") || !strings.Contains(out, "retention=1h0m0s") ||
		!strings.Contains(out, "reclaimed_bytes=") {
		t.Fatalf("logged %q; want one line with runs=1", out)
	}
	// Close stops a pruner still running.
	db.StartPruning(time.Hour, time.Millisecond, log)
}

// What a prune deletes is given back to the file system: the node's file
// shrinks instead of keeping the largest size it reached. A second Reclaim
// has nothing left to give.
func TestReclaimShrinksTheFileAfterAPrune(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "node.db")
	db := open(t, "file:"+path+"?mode=rwc")
	chats := sqlite.NewChatStore(db)
	big := strings.Repeat("x", 100_000)
	for i := range 60 {
		msgs := []domain.ChatMessage{{Role: "user", Content: big}, {Role: "assistant", Content: big, Reply: true}}
		if err := chats.AppendChat(ctx, "llm", "m", fmt.Sprintf("s%d", i%3), msgs); err != nil {
			t.Fatal(err)
		}
	}
	grown := fileSize(t, path) + fileSize(t, path+"-wal")
	// Every session is idle since before a cutoff a minute ahead.
	res, err := db.Prune(ctx, time.Now().Add(time.Minute))
	if err != nil || res.ChatSessions != 3 {
		t.Fatalf("Prune = %+v, %v", res, err)
	}
	if err := chats.AppendChat(ctx, "llm", "m", "after", []domain.ChatMessage{{Role: "user", Content: "still here"}}); err != nil {
		t.Fatal(err)
	}
	freed, err := db.Reclaim(ctx)
	if err != nil || freed < 10<<20 {
		t.Fatalf("Reclaim = %d, %v; want the ≈ 12 MB pruned given back", freed, err)
	}
	if s := fileSize(t, path) + fileSize(t, path+"-wal"); s > grown/4 {
		t.Fatalf("the store's files take %d bytes after the prune, %d before it", s, grown)
	}
	if got, err := chats.LoadChat(ctx, "llm", "after", 0); err != nil || len(got) != 1 || got[0].Content != "still here" {
		t.Fatalf("a session written after the prune: %+v, %v", got, err)
	}
	if freed, err := db.Reclaim(ctx); err != nil || freed != 0 {
		t.Fatalf("second Reclaim = %d, %v", freed, err)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// A run of an idle session that starts while a prune pass is under way,
// after the pass found the session idle but before it deleted its
// history, keeps the session: the history it replays is not deleted
// under it (the deletion was decided on a look taken before the run).
func TestPruneKeepsASessionWhoseRunStartedDuringThePass(t *testing.T) {
	for name, openDB := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			turn := []domain.ChatMessage{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello", Reply: true}}
			db, runs, chats, cutoff := staleSession(t, openDB, turn)
			db.BeforeNth("DELETE FROM chat_messages", 1, func() {
				addRun(t, runs, "turn2", "ollama", "s1", time.Now(), time.Time{}, domain.EventStart)
			})
			res, err := db.Prune(ctx, cutoff)
			if err != nil {
				t.Fatal(err)
			}
			if res.ChatMessages != 0 {
				t.Errorf("Prune deleted %d messages of a session with a run in flight", res.ChatMessages)
			}
			if msgs, err := chats.LoadChat(ctx, "ollama", "s1", 0); err != nil || len(msgs) != len(turn) {
				t.Errorf("LoadChat = %d messages, %v; want the %d of its history", len(msgs), err, len(turn))
			}
			list, err := chats.ListChats(ctx, "ollama", domain.SessionQuery{})
			if err != nil || len(list) != 1 || list[0].Turns != 1 {
				t.Errorf("ListChats = %+v, %v; want s1 with its turn", list, err)
			}
		})
	}
}

// A session's history is deleted a chunk at a time, each chunk up to the
// start of a turn: a run of the session that starts between two chunks
// (and stops the rest) replays whole turns, never a tool result whose
// call was deleted, which a provider refuses.
func TestPruneChunksEndAtATurn(t *testing.T) {
	for name, openDB := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			history := []domain.ChatMessage{
				{Role: "system", Content: "use tools"},
				{Role: "user", Content: "weather?"},
				{Role: "assistant", Raw: `{"role":"assistant","content":"","tool_calls":[{"id":"c1"}]}`},
				{Role: "tool", Raw: `{"role":"tool","tool_call_id":"c1","content":"sunny"}`},
				{Role: "assistant", Content: "sunny", Reply: true},
				{Role: "user", Content: "thanks"},
				{Role: "assistant", Content: "welcome", Reply: true},
			}
			db, runs, chats, cutoff := staleSession(t, openDB, history)
			// The second chat_messages statement finds a run in flight.
			db.BeforeNth("DELETE FROM chat_messages", 2, func() {
				addRun(t, runs, "turn3", "ollama", "s1", time.Now(), time.Time{}, domain.EventStart)
			})
			if _, err := db.PruneChunks(ctx, cutoff, 3); err != nil {
				t.Fatal(err)
			}
			msgs, err := chats.LoadChat(ctx, "ollama", "s1", 0)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(msgs, history[5:]) {
				t.Errorf("history left: %+v, want the last turn whole", msgs)
			}
			list, err := chats.ListChats(ctx, "ollama", domain.SessionQuery{})
			if err != nil || len(list) != 1 || list[0].Turns != 1 {
				t.Errorf("ListChats = %+v, %v; want s1 with one turn", list, err)
			}
		})
	}
}

// A turn of an idle session that starts and ends while a prune pass is
// under way, after the pass found the session idle but before it deleted
// its history, keeps the session: the history it replayed and answered is
// not deleted under it, which would leave its tool result without the
// call it answers (a history every provider refuses from then on).
func TestPruneKeepsASessionThatWasUsedDuringThePass(t *testing.T) {
	for name, openDB := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			history := []domain.ChatMessage{
				{Role: "system", Content: "use tools"},
				{Role: "user", Content: "weather?"},
				{Role: "assistant", Raw: `{"role":"assistant","content":"","tool_calls":[{"id":"c1"}]}`},
			}
			db, runs, chats, cutoff := staleSession(t, openDB, history)
			answer := []domain.ChatMessage{
				{Role: "tool", Raw: `{"role":"tool","tool_call_id":"c1","content":"sunny"}`},
				{Role: "assistant", Content: "sunny", Reply: true},
			}
			// A whole turn runs between the look-up and the first delete.
			db.BeforeNth("DELETE FROM chat_messages", 1, func() {
				now := time.Now()
				addRun(t, runs, "turn2", "ollama", "s1", now, now, domain.EventComplete)
				if err := chats.AppendChat(ctx, "ollama", "m", "s1", answer); err != nil {
					t.Fatal(err)
				}
			})
			res, err := db.Prune(ctx, cutoff)
			if err != nil {
				t.Fatal(err)
			}
			if res.ChatMessages != 0 || res.ChatSessions != 0 {
				t.Errorf("Prune deleted %d messages (%d sessions) of a session used during the pass", res.ChatMessages, res.ChatSessions)
			}
			msgs, err := chats.LoadChat(ctx, "ollama", "s1", 0)
			if err != nil {
				t.Fatal(err)
			}
			if want := append(slices.Clone(history), answer...); !slices.Equal(msgs, want) {
				t.Errorf("history left: %+v, want all of it: %+v", msgs, want)
			}
			list, err := chats.ListChats(ctx, "ollama", domain.SessionQuery{})
			if err != nil || len(list) != 1 || list[0].Turns != 1 {
				t.Errorf("ListChats = %+v, %v; want s1 with its turn", list, err)
			}
		})
	}
}

// One long agent turn (a user message, then a long run of tool calls and
// their results) is deleted a chunk at a time too, each chunk up to a
// message of the model's, the turn's user message kept: not in one
// statement, which on SQLite would hold every run and turn of the node
// until it ended, and never leaving a tool result without its call.
func TestPruneChunksALongTurn(t *testing.T) {
	for name, openDB := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			history := []domain.ChatMessage{{Role: "system", Content: "use tools"}, {Role: "user", Content: "build it"}}
			for i := range 40 {
				history = append(history,
					domain.ChatMessage{Role: "assistant", Raw: fmt.Sprintf(`{"role":"assistant","content":"","tool_calls":[{"id":"c%d"}]}`, i)},
					domain.ChatMessage{Role: "tool", Raw: fmt.Sprintf(`{"role":"tool","tool_call_id":"c%d","content":"ok"}`, i)})
			}
			history = append(history, domain.ChatMessage{Role: "assistant", Content: "built", Reply: true})
			db, runs, chats, cutoff := staleSession(t, openDB, history)
			// The second chat_messages statement finds a run in flight.
			db.BeforeNth("DELETE FROM chat_messages", 2, func() {
				addRun(t, runs, "turn2", "ollama", "s1", time.Now(), time.Time{}, domain.EventStart)
			})
			res, err := db.PruneChunks(ctx, cutoff, 3)
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := chats.LoadChat(ctx, "ollama", "s1", 0)
			if err != nil {
				t.Fatal(err)
			}
			// Chunk one: the system message and the first tool-call group;
			// the turn's user message stays, then the rest from the
			// model's call c1 on.
			if want := append(slices.Clone(history[1:2]), history[4:]...); res.ChatMessages != 3 || !slices.Equal(msgs, want) {
				t.Errorf("Prune deleted %d messages, left %d: %+v; want 3 deleted, the user message and the rest from the model's call c1 kept",
					res.ChatMessages, len(msgs), msgs)
			}
			// Once the run ends, the next pass deletes the rest, still a
			// chunk (and a group) at a time.
			if err := runs.UpdateRun(ctx, "turn2", func(r *domain.Run) error {
				return r.Finish(domain.RunEvent{Type: domain.EventComplete}, time.Now())
			}); err != nil {
				t.Fatal(err)
			}
			deletes := db.CountDeletes()
			if res, err = db.PruneChunks(ctx, cutoff, 3); err != nil || res.ChatMessages != int64(len(history)-3) || res.ChatSessions != 1 {
				t.Fatalf("second PruneChunks = %+v, %v; want the other %d messages of s1", res, err, len(history)-3)
			}
			if n := deletes.Load(); n < 20 {
				t.Errorf("%d DELETE statements deleted the %d messages of a turn, want one per chunk of 3 (or a little more)", n, len(history)-3)
			}
			if msgs, err := chats.LoadChat(ctx, "ollama", "s1", 0); err != nil || len(msgs) != 0 {
				t.Errorf("LoadChat after the second pass = %d messages, %v; want none", len(msgs), err)
			}
		})
	}
}

// staleSession opens a node store whose session s1 of adapter ollama holds
// history, its messages made two days ago, and returns it with its run and
// chat stores and a prune cutoff an hour after the messages.
func staleSession(t *testing.T, openDB func(*testing.T) *sqlite.DB, history []domain.ChatMessage) (
	*sqlite.DB, *sqlite.RunStore, *sqlite.ChatStore, time.Time) {
	t.Helper()
	ctx := context.Background()
	db := openDB(t)
	runs, chats := sqlite.NewRunStore(db), sqlite.NewChatStore(db)
	old := time.Now().UTC().Add(-48 * time.Hour)
	if err := chats.AppendChat(ctx, "ollama", "m", "s1", history); err != nil {
		t.Fatal(err)
	}
	if err := db.Backdate(ctx, "chat_messages", "created_at", "ollama", "s1", old); err != nil {
		t.Fatal(err)
	}
	return db, runs, chats, old.Add(time.Hour)
}
