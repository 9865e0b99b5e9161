package sqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/uptrace/bun/driver/sqliteshim"
	"go.uber.org/goleak"

	"iop/adapters/store/pgtest"
	"iop/adapters/store/sqlite"
	"iop/adapters/store/storetest"
	"iop/domain"
	"iop/ports"
)

func TestMain(m *testing.M) {
	// The cleanup must exit with the code it is given: goleak leaves that
	// to it, so without the exit a leak found after passing tests was only
	// printed.
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		pgtest.StopShared()
		os.Exit(code)
	}))
}

// fileDSN names a fresh database file in a temporary directory, in the form
// of DefaultDSN.
func fileDSN(t *testing.T) string {
	return "file:" + filepath.Join(t.TempDir(), "iop.db") + "?cache=shared&mode=rwc"
}

func open(t *testing.T, dsn string) *sqlite.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("Open(%s): %v", dsn, err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return db
}

func TestRunStoreContract(t *testing.T) {
	storetest.RunStoreContract(t, func(t *testing.T) ports.RunStore { return sqlite.NewRunStore(open(t, fileDSN(t))) })
}

func TestChatStoreContract(t *testing.T) {
	storetest.ChatStoreContract(t, func(t *testing.T) ports.ChatSessionStore { return sqlite.NewChatStore(open(t, fileDSN(t))) })
}

func TestAgentSessionStoreContract(t *testing.T) {
	storetest.AgentSessionStoreContract(t, func(t *testing.T) ports.AgentSessionStore {
		return sqlite.NewAgentSessionStore(open(t, fileDSN(t)))
	})
}

// openPostgres opens the node's stores on a fresh database of the test's
// own PostgreSQL server (skipping when PostgreSQL is not installed).
func openPostgres(t *testing.T) *sqlite.DB {
	t.Helper()
	db, err := sqlite.OpenPostgres(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatalf("OpenPostgres: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// The same contract on PostgreSQL: the SQL must be portable.
func TestPostgresRunStoreContract(t *testing.T) {
	storetest.RunStoreContract(t, func(t *testing.T) ports.RunStore { return sqlite.NewRunStore(openPostgres(t)) })
}

func TestPostgresChatStoreContract(t *testing.T) {
	storetest.ChatStoreContract(t, func(t *testing.T) ports.ChatSessionStore { return sqlite.NewChatStore(openPostgres(t)) })
}

func TestPostgresAgentSessionStoreContract(t *testing.T) {
	storetest.AgentSessionStoreContract(t, func(t *testing.T) ports.AgentSessionStore {
		return sqlite.NewAgentSessionStore(openPostgres(t))
	})
}

// An in-memory database lives as long as its DB: the pool's single
// connection is never recycled.
func TestMemoryDSN(t *testing.T) {
	storetest.RunStoreContract(t, func(t *testing.T) ports.RunStore { return sqlite.NewRunStore(open(t, ":memory:")) })
}

func TestOpenErrors(t *testing.T) {
	cases := []struct{ name, dsn string }{
		{"empty dsn", ""},
		{"missing directory", "file:" + filepath.Join(t.TempDir(), "no", "such", "dir", "iop.db") + "?mode=rwc"},
		{"read-only missing file", "file:" + filepath.Join(t.TempDir(), "iop.db") + "?mode=ro"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if db, err := sqlite.Open(context.Background(), tc.dsn); err == nil {
				_ = db.Close()
				t.Fatalf("Open(%q) succeeded", tc.dsn)
			}
		})
	}
}

func TestDataSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	dsn := fileDSN(t)
	created := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

	db, err := sqlite.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	run, err := domain.NewRun(domain.RunRequest{RunID: "r1", Adapter: "ollama", Target: "m", SessionID: "s1"}, created)
	if err != nil {
		t.Fatal(err)
	}
	runs := sqlite.NewRunStore(db)
	if err := runs.CreateRun(ctx, run); err != nil {
		t.Fatal(err)
	}
	usage := &domain.Usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}
	if err := runs.UpdateRun(ctx, "r1", func(r *domain.Run) error {
		return r.Finish(domain.RunEvent{Type: domain.EventComplete, Usage: usage}, created.Add(time.Second))
	}); err != nil {
		t.Fatal(err)
	}
	msgs := []domain.ChatMessage{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello"}}
	if err := sqlite.NewChatStore(db).AppendChat(ctx, "ollama", "m", "s1", msgs); err != nil {
		t.Fatal(err)
	}
	if err := sqlite.NewAgentSessionStore(db).PutAgentSession(ctx, "codex", "t", "s1", "thread-1"); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	db = open(t, dsn)
	got, err := sqlite.NewRunStore(db).GetRun(ctx, "r1")
	if err != nil {
		t.Fatalf("GetRun after reopen: %v", err)
	}
	s := got.Snapshot()
	if s.Status != domain.RunSucceeded || s.Usage == nil || *s.Usage != *usage || !s.FinishedAt.Equal(created.Add(time.Second)) {
		t.Fatalf("run after reopen = %+v", s)
	}
	loaded, err := sqlite.NewChatStore(db).LoadChat(ctx, "ollama", "s1", 0)
	if err != nil || len(loaded) != 2 || loaded[1] != msgs[1] {
		t.Fatalf("LoadChat after reopen = %v, %v", loaded, err)
	}
	// Appending after a reopen continues the sequence rather than colliding with it.
	if err := sqlite.NewChatStore(db).AppendChat(ctx, "ollama", "m", "s1", msgs[:1]); err != nil {
		t.Fatalf("AppendChat after reopen: %v", err)
	}
	id, ok, err := sqlite.NewAgentSessionStore(db).GetAgentSession(ctx, "codex", "s1")
	if err != nil || !ok || id.AgentID != "thread-1" {
		t.Fatalf("GetAgentSession after reopen = %+v, %v, %v", id, ok, err)
	}
}

func TestConcurrentUpdates(t *testing.T) {
	ctx := context.Background()
	store := sqlite.NewRunStore(open(t, fileDSN(t)))
	const n = 20
	now := time.Now()
	for i := range n {
		r, err := domain.NewRun(domain.RunRequest{RunID: fmt.Sprintf("r%02d", i), Adapter: "exec"}, now)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.CreateRun(ctx, r); err != nil {
			t.Fatal(err)
		}
	}

	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			id := fmt.Sprintf("r%02d", i)
			errs <- store.UpdateRun(ctx, id, func(r *domain.Run) error { return r.Start(time.Now()) })
			errs <- store.UpdateRun(ctx, id, func(r *domain.Run) error {
				return r.Finish(domain.RunEvent{Type: domain.EventComplete}, time.Now())
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("UpdateRun: %v", err)
		}
	}
	usage, err := store.UsageByAdapter(ctx)
	if err != nil || len(usage) != 1 || usage[0].Succeeded != n {
		t.Fatalf("UsageByAdapter = %+v, %v; want %d succeeded", usage, err, n)
	}
}

// A database whose agent_sessions table predates the turn count and totals
// gets the new columns on open, and its rows keep working.
func TestAgentSessionsOldSchemaGainsColumns(t *testing.T) {
	dsn := fileDSN(t)
	old, err := sql.Open(sqliteshim.ShimName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = old.Exec(`CREATE TABLE agent_sessions (adapter VARCHAR NOT NULL, session_id VARCHAR NOT NULL, agent_id VARCHAR NOT NULL, target VARCHAR NOT NULL, updated_at TIMESTAMP NOT NULL, PRIMARY KEY (adapter, session_id));
		INSERT INTO agent_sessions VALUES ('codex', 's1', 'thread-1', 't', '2026-01-02 03:04:05+00:00');`)
	old.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := sqlite.NewAgentSessionStore(open(t, dsn))
	ctx := context.Background()
	if err := s.EndAgentTurn(ctx, "codex", "s1", domain.AgentTotals{Input: 5, Output: 1}); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.GetAgentSession(ctx, "codex", "s1")
	if err != nil || !ok || got != (domain.AgentSession{AgentID: "thread-1", Turns: 1, Totals: domain.AgentTotals{Input: 5, Output: 1}}) {
		t.Fatalf("GetAgentSession = %+v, %v, %v", got, ok, err)
	}
}

// A database whose chat_messages table predates the raw message JSON gets
// the column on open; its rows load with no Raw (they replay as role and
// content) and new rows keep theirs.
func TestChatMessagesOldSchemaGainsColumns(t *testing.T) {
	dsn := fileDSN(t)
	old, err := sql.Open(sqliteshim.ShimName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = old.Exec(`CREATE TABLE chat_messages (adapter VARCHAR NOT NULL, session_id VARCHAR NOT NULL, seq BIGINT NOT NULL, target VARCHAR NOT NULL, role VARCHAR NOT NULL, content VARCHAR NOT NULL, created_at TIMESTAMP NOT NULL, PRIMARY KEY (adapter, session_id, seq));
		INSERT INTO chat_messages VALUES ('ollama', 's1', 1, 'm', 'user', 'hi', '2026-01-02 03:04:05+00:00');
		INSERT INTO chat_messages VALUES ('ollama', 's1', 2, 'm', 'assistant', 'hello', '2026-01-02 03:04:06+00:00');`)
	old.Close()
	if err != nil {
		t.Fatal(err)
	}
	s := sqlite.NewChatStore(open(t, dsn))
	ctx := context.Background()
	// Its sessions are summed up for session_list when the node opens it.
	sum := domain.SessionInfo{Adapter: "ollama", Target: "m", SessionID: "s1", Turns: 1, LastUsed: time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)}
	if list, err := s.ListChats(ctx, "", domain.SessionQuery{}); err != nil || len(list) != 1 || list[0] != sum {
		t.Fatalf("ListChats of the old database = %+v, %v; want %+v", list, err, sum)
	}
	next := domain.ChatMessage{Role: "tool", Content: "12:00", Raw: `{"role":"tool","tool_call_id":"call_1","content":"12:00"}`}
	if err := s.AppendChat(ctx, "ollama", "m", "s1", []domain.ChatMessage{next}); err != nil {
		t.Fatal(err)
	}
	got, err := s.LoadChat(ctx, "ollama", "s1", 0)
	want := []domain.ChatMessage{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello", Reply: true}, next}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("LoadChat = %+v, %v; want %+v", got, err, want)
	}
	// The old assistant row counts as the turn it was counted as before.
	if list, err := s.ListChats(ctx, "ollama", domain.SessionQuery{}); err != nil || len(list) != 1 || list[0].Turns != 1 {
		t.Fatalf("ListChats = %+v, %v", list, err)
	}
}

// A database file truncated to 0 bytes is refused, not silently recreated
// as an empty store; a missing file is still created.
func TestOpenRefusesTruncatedFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "node.db")
	dsn := "file:" + path + "?cache=shared&mode=rwc"
	db, err := sqlite.Open(ctx, dsn)
	if err != nil {
		t.Fatalf("open a new file: %v", err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	_, err = sqlite.Open(ctx, dsn)
	if err == nil || !strings.Contains(err.Error(), "empty (0 bytes)") || !strings.Contains(err.Error(), path) {
		t.Fatalf("open a truncated file: %v; want a clear refusal naming it", err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Fatalf("the truncated file was written to (%d bytes)", fi.Size())
	}
	if got := sqlite.FilePath("file::memory:?cache=shared"); got != "" {
		t.Errorf("FilePath of a memory DSN: %q", got)
	}
	if got := sqlite.FilePath("/var/lib/iop/node.db"); got != "/var/lib/iop/node.db" {
		t.Errorf("FilePath of a plain path: %q", got)
	}
}

// A store file opens read-only (the sqlite3 shell's way, a test's) while
// its node writes: no setting a read-only connection cannot make is sent.
func TestOpenReadOnly(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "iop.db")
	rw := open(t, "file:"+path+"?mode=rwc")
	r, err := domain.NewRun(domain.RunRequest{RunID: "r1", Adapter: "exec", Target: "t"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := sqlite.NewRunStore(rw).CreateRun(ctx, r); err != nil {
		t.Fatal(err)
	}
	ro, err := sqlite.Open(ctx, "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatalf("read-only open: %v", err)
	}
	defer ro.Close()
	if _, err := sqlite.NewRunStore(ro).GetRun(ctx, "r1"); err != nil {
		t.Fatalf("read-only read: %v", err)
	}
}

// Rows a node wrote before its store kept usage within bounds — a count
// near the int64 maximum whose total wrapped negative, two that sum past
// it, a cost of 1e308 twice — are summed within the bounds:
// usage_status answered 500 for the store's whole retention (a sum that
// overflowed into a float, SQLite's "integer overflow", an infinite cost).
func TestUsageSumsRowsWrittenBeforeTheBounds(t *testing.T) {
	dsn := fileDSN(t)
	db := open(t, dsn)
	s := sqlite.NewRunStore(db)
	ctx := context.Background()
	for _, id := range []string{"old1", "old2", "old3"} {
		run, err := domain.NewRun(domain.RunRequest{RunID: id, Adapter: "openai", Target: "m"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.CreateRun(ctx, run); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := sql.Open(sqliteshim.ShimName, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_, err = raw.Exec(`UPDATE runs SET status = 'succeeded', prompt_tokens = 9223372036854775800, completion_tokens = 100,
			total_tokens = -9223372036854775716, cost_usd = 1e308 WHERE id = 'old1';
		UPDATE runs SET status = 'succeeded', prompt_tokens = 9223372036854775800, completion_tokens = 0,
			total_tokens = 9223372036854775800, cost_usd = 1e308 WHERE id = 'old2';
		UPDATE runs SET status = 'succeeded', prompt_tokens = -3, completion_tokens = 5, total_tokens = 0, cost_usd = -1 WHERE id = 'old3';`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.UsageByAdapter(ctx)
	want := []domain.UsageSummary{{Adapter: "openai", RunsTotal: 3, Succeeded: 3,
		PromptTokens: 2 * domain.MaxUsageTokens, CompletionTokens: 105, TotalTokens: 2*domain.MaxUsageTokens + 100 + 5,
		CostUSD: 2 * domain.MaxUsageCostUSD}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("UsageByAdapter = %+v, %v; want %+v", got, err, want)
	}
}

// Sessions of several adapters last used at the same instant: each
// adapter's page after a cursor of any adapter holds what listing all
// sessions in order (ties by adapter, then session id, descending) puts
// after it, chat sessions and agent sessions alike, on SQLite and
// PostgreSQL.
func TestSessionPagesWithTies(t *testing.T) {
	for name, openDB := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			db := openDB(t)
			chats, agents := sqlite.NewChatStore(db), sqlite.NewAgentSessionStore(db)
			tie := time.Date(2026, 2, 3, 4, 5, 6, 789000, time.UTC)
			for _, a := range []string{"a", "b", "c"} {
				for _, s := range []string{"s1", "s2", "s3"} {
					if err := chats.AppendChat(ctx, a, "m", s, []domain.ChatMessage{{Role: "user", Content: "q"}}); err != nil {
						t.Fatal(err)
					}
					if err := agents.PutAgentSession(ctx, a, "m", s, "x"); err != nil {
						t.Fatal(err)
					}
					if s == "s3" {
						continue // used later than the tie
					}
					for _, tc := range [][2]string{{"chat_sessions", "last_used"}, {"agent_sessions", "updated_at"}} {
						if err := db.Backdate(ctx, tc[0], tc[1], a, s, tie); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			for kind, list := range map[string]func(string, domain.SessionQuery) ([]domain.SessionInfo, error){
				"chat": func(a string, q domain.SessionQuery) ([]domain.SessionInfo, error) { return chats.ListChats(ctx, a, q) },
				"agent": func(a string, q domain.SessionQuery) ([]domain.SessionInfo, error) {
					return agents.ListAgentSessions(ctx, a, q)
				},
			} {
				all, err := list("", domain.SessionQuery{})
				if err != nil || len(all) != 9 {
					t.Fatalf("%s: all = %d, %v", kind, len(all), err)
				}
				var tail []string
				for _, s := range all[3:] {
					tail = append(tail, s.Adapter+"/"+s.SessionID)
				}
				if want := []string{"c/s2", "c/s1", "b/s2", "b/s1", "a/s2", "a/s1"}; !slices.Equal(tail, want) {
					t.Fatalf("%s: tied sessions listed %v, want %v", kind, tail, want)
				}
				for i, s := range all {
					k := s.Key()
					for _, a := range []string{"", "a", "b", "c"} {
						page, err := list(a, domain.SessionQuery{Limit: 3, After: &k})
						var got, want []string
						for _, x := range page {
							got = append(got, x.Adapter+"/"+x.SessionID)
						}
						for _, x := range all[i+1:] {
							if len(want) < 3 && (a == "" || x.Adapter == a) {
								want = append(want, x.Adapter+"/"+x.SessionID)
							}
						}
						if err != nil || !slices.Equal(got, want) {
							t.Fatalf("%s: adapter %q after %s/%s: %v, %v; want %v", kind, a, k.Adapter, k.SessionID, got, err, want)
						}
					}
				}
			}
		})
	}
}

// A turn whose text holds a NUL byte (input "a\u0000b", or a model's
// reply with one) is stored: the insert failed ("unrecognized token"),
// so the run failed after the model had answered and the session could
// not go on. Its JSON, which a turn replays, is kept exactly; its text
// (for reading) has the NUL as U+FFFD, as the edge's history stores text.
func TestChatTurnWithNULIsStored(t *testing.T) {
	ctx := context.Background()
	chats := sqlite.NewChatStore(open(t, fileDSN(t)))
	turn := []domain.ChatMessage{
		{Role: "user", Content: "a\x00b", Raw: `{"role":"user","content":"a\u0000b"}`},
		{Role: "assistant", Content: "c\x00", Raw: `{"role":"assistant","content":"c\u0000"}`, Reply: true},
	}
	if err := chats.AppendChat(ctx, "ollama", "m", "s1", turn); err != nil {
		t.Fatalf("AppendChat: %v", err)
	}
	for _, bound := range []int{0, 1 << 20} {
		msgs, err := chats.LoadChat(ctx, "ollama", "s1", bound)
		if err != nil || len(msgs) != 2 {
			t.Fatalf("LoadChat(%d) = %+v, %v", bound, msgs, err)
		}
		for i, m := range msgs {
			if m.Raw != turn[i].Raw || m.Role != turn[i].Role || m.Reply != turn[i].Reply {
				t.Errorf("message %d = %+v, want %+v", i, m, turn[i])
			}
			if want := strings.ReplaceAll(turn[i].Content, "\x00", "\uFFFD"); m.Content != want {
				t.Errorf("message %d text = %q, want %q", i, m.Content, want)
			}
		}
	}
	if list, err := chats.ListChats(ctx, "ollama", domain.SessionQuery{}); err != nil || len(list) != 1 || list[0].Turns != 1 {
		t.Errorf("ListChats = %+v, %v", list, err)
	}
}
