package edgestore_test

import (
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/uptrace/bun/driver/sqliteshim"
	"go.uber.org/goleak"

	"iop/adapters/store/edgestore"
	"iop/adapters/store/pgtest"
	"iop/domain"
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

type opener func(t *testing.T) string // returns a DSN of an empty database

func sqliteDSN(t *testing.T) string { return filepath.Join(t.TempDir(), "edge.db") }

func TestSQLite(t *testing.T)   { contract(t, sqliteDSN) }
func TestPostgres(t *testing.T) { contract(t, func(t *testing.T) string { return pgtest.DSN(t) }) }

func open(t *testing.T, dsn string, o edgestore.Options) *edgestore.Store {
	t.Helper()
	db, err := edgestore.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if o.Retention == 0 {
		o.Retention = -1 // t0 is long past: the pruner would race the checks
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = 10 * time.Millisecond
	}
	s := edgestore.New(db, o)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// eventually polls f until it reports true or 10 s pass.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var t0 = time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)

func run(id, node, adapter, key string, status domain.RunStatus, at time.Time, u *domain.Usage) domain.RunRecord {
	r := domain.RunRecord{ID: id, Node: node, Adapter: adapter, Target: "t", SessionID: "s", Key: key, Status: status, CreatedAt: at}
	if status.Finished() {
		r.FinishedAt = at.Add(time.Second)
		r.Usage = u
	}
	if status == domain.RunFailed {
		r.ErrorCode, r.ErrorMsg = "adapter_error", "boom"
	}
	return r
}

// wantRunIDs checks the ids of the first page of q, in order.
func wantRunIDs(t *testing.T, s *edgestore.Store, q domain.RunQuery, want string) {
	t.Helper()
	p, err := s.ListRuns(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range p.Runs {
		got = append(got, r.ID)
	}
	if fmt.Sprint(got) != want {
		t.Fatalf("%+v: got %v, want %s", q, got, want)
	}
}

func contract(t *testing.T, newDSN opener) {
	ctx := context.Background()

	t.Run("run lifecycle and reopen", func(t *testing.T) {
		dsn := newDSN(t)
		s := open(t, dsn, edgestore.Options{EdgeID: "e1"})
		s.RecordRun(run("run_a", "n1", "exec", "", domain.RunRunning, t0, nil))
		fin := run("run_a", "n1", "exec", "", domain.RunSucceeded, t0,
			&domain.Usage{PromptTokens: 3, CompletionTokens: 4, CostUSD: 0.5, Model: "m1"})
		s.RecordRun(fin)
		var got domain.RunRecord
		eventually(t, "the finished run", func() bool {
			r, err := s.GetRun(ctx, "run_a")
			got = r
			return err == nil && r.Status == domain.RunSucceeded
		})
		if got.Key != domain.AnonymousName || got.Node != "n1" || !got.CreatedAt.Equal(t0) || !got.FinishedAt.Equal(t0.Add(time.Second)) ||
			got.Usage == nil || got.Usage.TotalTokens != 7 || got.Usage.CostUSD != 0.5 || got.Usage.Model != "m1" {
			t.Fatalf("run = %+v usage %+v", got, got.Usage)
		}
		if _, err := s.GetRun(ctx, "run_missing"); !errors.Is(err, domain.ErrRunNotFound) {
			t.Fatalf("missing run: %v", err)
		}
		_ = s.Close()
		// Migrations are idempotent: reopening keeps the rows.
		s2 := open(t, dsn, edgestore.Options{EdgeID: "e1"})
		if r, err := s2.GetRun(ctx, "run_a"); err != nil || r.Status != domain.RunSucceeded {
			t.Fatalf("after reopen: %+v %v", r, err)
		}
	})

	t.Run("a long error message is kept as its event has it", func(t *testing.T) {
		s := open(t, newDSN(t), edgestore.Options{})
		// An exec run's stderr tail (4 KiB) is longer than the other text
		// columns' bound; a message past what a node sends is cut with the
		// marker a node's own cut carries.
		whole := "exit status 1: " + strings.Repeat("é", 2100)
		over := strings.Repeat("x", 3*domain.MaxPeerMessage)
		for id, msg := range map[string]string{"run_whole": whole, "run_over": over} {
			r := run(id, "n1", "exec", "", domain.RunFailed, t0, nil)
			r.ErrorMsg = msg
			s.RecordRun(r)
		}
		for id, want := range map[string]string{"run_whole": whole, "run_over": domain.ClipMessage(over, domain.MaxPeerMessage)} {
			var got domain.RunRecord
			eventually(t, id, func() bool {
				r, err := s.GetRun(ctx, id)
				got = r
				return err == nil
			})
			if got.ErrorMsg != want {
				t.Fatalf("%s: error message of %d bytes (…%q), want %d bytes (…%q)", id, len(got.ErrorMsg),
					got.ErrorMsg[max(len(got.ErrorMsg)-30, 0):], len(want), want[len(want)-30:])
			}
		}
		if !strings.HasSuffix(domain.ClipMessage(over, domain.MaxPeerMessage), fmt.Sprintf("(%d bytes in all)", len(over))) {
			t.Fatal("ClipMessage left out its marker")
		}
	})

	t.Run("list filters and cursor pages", func(t *testing.T) {
		s := open(t, newDSN(t), edgestore.Options{})
		for i := range 7 {
			node, status, key := "n1", domain.RunSucceeded, "alice"
			if i%2 == 1 {
				node, status, key = "n2", domain.RunFailed, "bob"
			}
			s.RecordRun(run(fmt.Sprintf("run_%d", i), node, "exec", key, status, t0.Add(time.Duration(i)*time.Minute), nil))
		}
		// Two runs at the same instant: the id breaks the tie.
		s.RecordRun(run("run_x", "n1", "other", "alice", domain.RunRunning, t0.Add(3*time.Minute), nil))
		eventually(t, "8 runs", func() bool {
			p, err := s.ListRuns(ctx, domain.RunQuery{Limit: 100})
			return err == nil && len(p.Runs) == 8
		})
		var ids []string
		q := domain.RunQuery{Limit: 3}
		for {
			p, err := s.ListRuns(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range p.Runs {
				ids = append(ids, r.ID)
			}
			if p.Next == "" {
				break
			}
			q.Cursor = p.Next
		}
		want := []string{"run_6", "run_5", "run_4", "run_x", "run_3", "run_2", "run_1", "run_0"}
		if fmt.Sprint(ids) != fmt.Sprint(want) {
			t.Fatalf("pages = %v, want %v", ids, want)
		}
		check := func(q domain.RunQuery, want string) { t.Helper(); wantRunIDs(t, s, q, want) }
		check(domain.RunQuery{Node: "n2"}, "[run_5 run_3 run_1]")
		check(domain.RunQuery{Nodes: []string{"n2", "n9"}}, "[run_5 run_3 run_1]")
		check(domain.RunQuery{Status: domain.RunFailed, Key: "bob"}, "[run_5 run_3 run_1]")
		check(domain.RunQuery{Adapter: "other"}, "[run_x]")
		check(domain.RunQuery{Key: "alice", Since: t0.Add(2 * time.Minute), Until: t0.Add(6 * time.Minute)}, "[run_4 run_x run_2]")
		// A cursor is the caller's to send back: one that was tampered
		// with is refused as such, never reaches the query (a NUL in its
		// id failed the SQL, answered as the history being down).
		for _, c := range []string{"!!", base64.RawURLEncoding.EncodeToString([]byte("1|\x00")), base64.RawURLEncoding.EncodeToString([]byte("1|\xff"))} {
			if _, err := s.ListRuns(ctx, domain.RunQuery{Cursor: c}); domain.CodeOf(err) != domain.CodeInvalidRequest {
				t.Fatalf("bad cursor %q: %v", c, err)
			}
		}
	})

	t.Run("a session's runs", func(t *testing.T) {
		s := open(t, newDSN(t), edgestore.Options{})
		for i, sess := range []string{"chat-1", "chat-2", "", "chat-1", "chat-1"} {
			r := run(fmt.Sprintf("run_%d", i), fmt.Sprintf("n%d", i), "llm", "", domain.RunSucceeded, t0.Add(time.Duration(i)*time.Minute), nil)
			r.SessionID = sess
			if i == 4 {
				r.Adapter = "other"
			}
			s.RecordRun(r)
		}
		eventually(t, "5 runs", func() bool {
			p, err := s.ListRuns(ctx, domain.RunQuery{Limit: 100})
			return err == nil && len(p.Runs) == 5
		})
		for _, c := range []struct {
			q    domain.RunQuery
			want string
		}{
			{domain.RunQuery{Session: "chat-1"}, "[run_4 run_3 run_0]"},
			{domain.RunQuery{Session: "chat-1", Adapter: "llm"}, "[run_3 run_0]"},
			{domain.RunQuery{Session: "chat-1", Adapter: "llm", Limit: 1}, "[run_3]"},
			{domain.RunQuery{Session: "chat-2"}, "[run_1]"},
			{domain.RunQuery{Session: "chat-3"}, "[]"},
		} {
			wantRunIDs(t, s, c.q, c.want)
		}
	})

	t.Run("a session's runs a node took, by keys left out", func(t *testing.T) {
		// What an edge that forgot a session recalls its owner and node
		// from: refused runs (a caller retrying on at_capacity) are left
		// out by the query itself, and so are keys already seen.
		s := open(t, newDSN(t), edgestore.Options{})
		recs := []struct {
			key    string
			status domain.RunStatus
			code   string
		}{
			{"x", domain.RunSucceeded, ""},
			{"x", domain.RunFailed, "adapter_error"},
			{"ops", domain.RunRunning, ""},
			{"", domain.RunSucceeded, ""},
			{"x", domain.RunFailed, domain.CodeAtCapacity},
			{"y", domain.RunFailed, domain.CodeNoNodeAvailable},
			{"x", domain.RunFailed, domain.CodeSessionBusy},
			{"x", domain.RunCancelled, ""},
		}
		for i, c := range recs {
			r := run(fmt.Sprintf("run_%d", i), "n1", "llm", c.key, c.status, t0.Add(time.Duration(i)*time.Minute), nil)
			r.SessionID, r.ErrorCode = "chat-1", c.code
			s.RecordRun(r)
		}
		eventually(t, "8 runs", func() bool {
			p, err := s.ListRuns(ctx, domain.RunQuery{Session: "chat-1", Limit: 100})
			return err == nil && len(p.Runs) == len(recs) && p.Runs[0].Status == domain.RunCancelled
		})
		wantRunIDs(t, s, domain.RunQuery{Session: "chat-1", Adapter: "llm", Took: true}, "[run_7 run_6 run_3 run_2 run_1 run_0]")
		wantRunIDs(t, s, domain.RunQuery{Session: "chat-1", Took: true, ExcludeKeys: []string{"x"}}, "[run_3 run_2]")
		wantRunIDs(t, s, domain.RunQuery{Session: "chat-1", Took: true, ExcludeKeys: []string{"x", domain.AnonymousName, ""}}, "[run_2]")
		wantRunIDs(t, s, domain.RunQuery{Session: "chat-1", ExcludeKeys: []string{"x", "ops", domain.AnonymousName}}, "[run_5]")
		p, err := s.ListRuns(ctx, domain.RunQuery{Session: "chat-1", Took: true, Limit: 2})
		if err != nil || len(p.Runs) != 2 || p.Next == "" {
			t.Fatalf("first page of runs a node took: %+v %v, want 2 and more", p, err)
		}
	})

	t.Run("the tunnel that created a stored response", func(t *testing.T) {
		s := open(t, newDSN(t), edgestore.Options{})
		// Past the column, or with a NUL: not kept, never found (cut or
		// changed, two ids would match one row).
		long := "resp_" + strings.Repeat("x", 400)
		for i, tr := range []domain.TunnelRecord{
			{ID: "tun_a", Node: "n1", Provider: "p1", Key: "alice", Path: "/v1/responses", Status: 200, Response: "resp_1"},
			// A later tunnel answering with the same id does not take it.
			{ID: "tun_b", Node: "n2", Provider: "p2", Key: "bob", Path: "/v1/responses", Status: 200, Response: "resp_1"},
			{ID: "tun_c", Node: "n1", Provider: "p1", Key: "bob", Path: "/v1/chat/completions", Status: 200},
			{ID: "tun_d", Node: "n3", Provider: "p3", Path: "/v1/responses", Status: 200, Response: long},
			{ID: "tun_e", Node: "n3", Provider: "p3", Path: "/v1/responses", Status: 200, Response: "resp_\x00nul"},
		} {
			tr.StartedAt = t0.Add(time.Duration(i) * time.Minute)
			tr.FinishedAt = tr.StartedAt.Add(time.Second)
			s.RecordTunnel(tr)
		}
		eventually(t, "5 tunnels", func() bool {
			u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByNode})
			n := 0
			for _, g := range u {
				n += int(g.Tunnels)
			}
			return err == nil && n == 5
		})
		got, found, err := s.ResponseOrigin(ctx, "resp_1")
		if err != nil || !found || got.ID != "tun_a" || got.Node != "n1" || got.Provider != "p1" || got.Key != "alice" || got.Response != "resp_1" {
			t.Fatalf("resp_1: %+v found %v, %v; want tun_a's (n1, p1, alice)", got, found, err)
		}
		for _, id := range []string{"resp_2", "", "tun_c", long, long[:255], "resp_\x00nul", "resp_\uFFFDnul"} {
			if got, found, err := s.ResponseOrigin(ctx, id); err != nil || found {
				t.Fatalf("%q: %+v found %v, %v; want none", id, got, found, err)
			}
		}
	})

	t.Run("usage sums runs and tunnels", func(t *testing.T) {
		s := open(t, newDSN(t), edgestore.Options{})
		day2 := t0.Add(24 * time.Hour)
		s.RecordRun(run("run_1", "n1", "exec", "alice", domain.RunSucceeded, t0, &domain.Usage{PromptTokens: 1, CompletionTokens: 2, CostUSD: 0.25, Model: "m1"}))
		s.RecordRun(run("run_2", "n1", "exec", "alice", domain.RunFailed, t0, nil))
		s.RecordRun(run("run_3", "n2", "exec", "bob", domain.RunSucceeded, day2, &domain.Usage{TotalTokens: 10, Model: "m2"}))
		s.RecordTunnel(domain.TunnelRecord{ID: "tun_1", Node: "n2", Provider: "p", Model: "m1", Key: "alice", Status: 200, BodyBytes: 100,
			StartedAt: t0, FinishedAt: t0.Add(time.Second), Usage: &domain.Usage{PromptTokens: 5, CompletionTokens: 5}})
		s.RecordTunnel(domain.TunnelRecord{ID: "tun_2", Node: "n2", Provider: "p", Model: "m1", Status: 502, ErrorCode: "provider_error",
			BodyBytes: 7, StartedAt: day2, FinishedAt: day2})
		eventually(t, "rows", func() bool {
			u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByNode})
			return err == nil && len(u) == 2 && u[1].Requests == 3
		})
		cases := []struct {
			by   string
			want string
		}{
			{domain.GroupByKey, "[{alice 2 1 3 1 6 7 13 0.25 100} {anonymous 0 1 1 1 0 0 0 0 7} {bob 1 0 1 0 0 0 10 0 0}]"},
			{domain.GroupByNode, "[{n1 2 0 2 1 1 2 3 0.25 0} {n2 1 2 3 1 5 5 20 0 107}]"},
			{domain.GroupByModel, "[{ 1 0 1 1 0 0 0 0 0} {m1 1 2 3 1 6 7 13 0.25 107} {m2 1 0 1 0 0 0 10 0 0}]"},
			{domain.GroupByDay, "[{2026-03-01 2 1 3 1 6 7 13 0.25 100} {2026-03-02 1 1 2 1 0 0 10 0 7}]"},
		}
		for _, c := range cases {
			u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: c.by})
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(u); got != c.want {
				t.Errorf("group_by=%s:\n got %s\nwant %s", c.by, got, c.want)
			}
		}
		u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByNode, Nodes: []string{"n1"}})
		if err != nil || fmt.Sprint(u) != "[{n1 2 0 2 1 1 2 3 0.25 0}]" {
			t.Fatalf("nodes limit: %v %v", u, err)
		}
		u, err = s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByKey, Since: day2})
		if err != nil || fmt.Sprint(u) != "[{anonymous 0 1 1 1 0 0 0 0 7} {bob 1 0 1 0 0 0 10 0 0}]" {
			t.Fatalf("since: %v %v", u, err)
		}
		if _, err := s.Usage(ctx, domain.UsageQuery{GroupBy: "colour"}); domain.CodeOf(err) != domain.CodeInvalidRequest {
			t.Fatalf("bad group_by: %v", err)
		}
	})

	t.Run("prune keeps recent and in-flight runs", func(t *testing.T) {
		s := open(t, newDSN(t), edgestore.Options{Retention: -1})
		s.RecordRun(run("run_old", "n1", "exec", "", domain.RunSucceeded, t0, nil))
		s.RecordRun(run("run_old_live", "n1", "exec", "", domain.RunRunning, t0, nil))
		s.RecordRun(run("run_new", "n1", "exec", "", domain.RunSucceeded, t0.Add(48*time.Hour), nil))
		s.RecordTunnel(domain.TunnelRecord{ID: "tun_old", Node: "n1", StartedAt: t0, FinishedAt: t0})
		eventually(t, "rows", func() bool {
			p, _ := s.ListRuns(ctx, domain.RunQuery{})
			return len(p.Runs) == 3
		})
		if n, err := s.Prune(ctx, t0.Add(24*time.Hour)); err != nil || n != 2 {
			t.Fatalf("Prune = %d, %v; want 2 rows", n, err)
		}
		p, _ := s.ListRuns(ctx, domain.RunQuery{})
		if len(p.Runs) != 2 || p.Runs[0].ID != "run_new" || p.Runs[1].ID != "run_old_live" {
			t.Fatalf("after prune: %+v", p.Runs)
		}
	})

	// PostgreSQL refuses a NUL byte in text, and one refused row used to
	// cost its whole batch. NULs come from callers and programs (a tunnel's
	// decoded path, an exec run's stderr tail): they are stored as U+FFFD.
	t.Run("a row with a NUL byte is written with the rows batched with it", func(t *testing.T) {
		var dropped atomic.Int64
		// A long interval: every row below lands in one batch.
		s := open(t, newDSN(t), edgestore.Options{FlushInterval: 300 * time.Millisecond, Dropped: func(n int) { dropped.Add(int64(n)) }})
		for i := range 5 {
			s.RecordRun(run(fmt.Sprintf("run_good%d", i), "n1", "exec", "", domain.RunSucceeded, t0, nil))
		}
		bad := run("run_nul", "n1", "exec", "", domain.RunFailed, t0, nil)
		bad.ErrorMsg = "stderr: \x00\x01 binary"
		s.RecordRun(bad)
		s.RecordTunnel(domain.TunnelRecord{ID: "tun_nul", Node: "n1", Provider: "p", Path: "/api/blobs/sha256:\x00x",
			Status: 404, StartedAt: t0, FinishedAt: t0})
		eventually(t, "the batch written", func() bool {
			u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByNode})
			return dropped.Load() > 0 || (err == nil && len(u) == 1 && u[0].Runs == 6 && u[0].Tunnels == 1)
		})
		if n := dropped.Load(); n != 0 {
			t.Fatalf("%d rows dropped", n)
		}
		r, err := s.GetRun(ctx, "run_nul")
		if err != nil || r.ErrorMsg != "stderr: \uFFFD\x01 binary" {
			t.Fatalf("run_nul = %q, %v; want its message with U+FFFD for the NUL", r.ErrorMsg, err)
		}
	})

	// A cost that is not a number (a node's or provider's bug) is stored
	// as 0: on SQLite it failed the column and lost its whole batch, on
	// PostgreSQL every sum over it was NaN, which the usage API could not
	// encode. Cost totals are rounded to a nanodollar, so both databases
	// answer the same for the same rows (ten runs of 0.1 USD are 1).
	t.Run("costs: NaN stored as 0, totals alike on every database", func(t *testing.T) {
		var dropped atomic.Int64
		s := open(t, newDSN(t), edgestore.Options{FlushInterval: 300 * time.Millisecond, Dropped: func(n int) { dropped.Add(int64(n)) }})
		for i := range 10 {
			s.RecordRun(run(fmt.Sprintf("run_dime%d", i), "n1", "exec", "dave", domain.RunSucceeded, t0, &domain.Usage{CostUSD: 0.1}))
		}
		s.RecordRun(run("run_nan", "n1", "exec", "mallory", domain.RunSucceeded, t0, &domain.Usage{PromptTokens: 1, CostUSD: math.NaN()}))
		s.RecordTunnel(domain.TunnelRecord{ID: "tun_inf", Node: "n1", Provider: "p", Key: "mallory", Status: 200, StartedAt: t0, FinishedAt: t0,
			Usage: &domain.Usage{PromptTokens: 1, CostUSD: math.Inf(1)}})
		var u []domain.UsageTotal
		eventually(t, "the batch written", func() bool {
			var err error
			u, err = s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByKey})
			return dropped.Load() > 0 || (err == nil && len(u) == 2 && u[0].Requests+u[1].Requests == 12)
		})
		if n := dropped.Load(); n != 0 {
			t.Fatalf("%d rows dropped", n)
		}
		if _, err := json.Marshal(u); err != nil {
			t.Fatalf("usage cannot be encoded: %v", err)
		}
		for _, g := range u {
			if want := map[string]float64{"dave": 1, "mallory": 0}[g.Group]; g.CostUSD != want {
				t.Errorf("%s: cost %v, want %v", g.Group, g.CostUSD, want)
			}
		}
	})

	// A node or provider may report anything. Two reports of tokens near
	// the int64 maximum overflowed every sum over them (SQLite "integer
	// overflow", PostgreSQL "out of range"), and two costs of 1.5e308 summed
	// to +Inf, which JSON cannot encode: GET /v1/usage failed for the whole
	// retention period. The numbers are stored within bounds.
	t.Run("absurd usage numbers are stored within bounds", func(t *testing.T) {
		var dropped atomic.Int64
		s := open(t, newDSN(t), edgestore.Options{FlushInterval: 300 * time.Millisecond, Dropped: func(n int) { dropped.Add(int64(n)) }})
		huge := &domain.Usage{PromptTokens: math.MaxInt64, CompletionTokens: math.MaxInt64 / 2, CostUSD: 1.5e308}
		s.RecordRun(run("run_huge1", "n1", "exec", "eve", domain.RunSucceeded, t0, huge))
		s.RecordRun(run("run_huge2", "n1", "exec", "eve", domain.RunSucceeded, t0, huge))
		s.RecordRun(run("run_neg", "n1", "exec", "eve", domain.RunSucceeded, t0, &domain.Usage{PromptTokens: -5, TotalTokens: -9, CostUSD: -1}))
		s.RecordTunnel(domain.TunnelRecord{ID: "tun_huge", Node: "n1", Provider: "p", Key: "eve", Status: 200, StartedAt: t0, FinishedAt: t0,
			Usage: &domain.Usage{TotalTokens: math.MaxInt64, CostUSD: math.MaxFloat64}})
		var u []domain.UsageTotal
		eventually(t, "the rows written", func() bool {
			var err error
			u, err = s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByKey})
			return dropped.Load() > 0 || (err == nil && len(u) == 1 && u[0].Requests == 4)
		})
		if n := dropped.Load(); n != 0 {
			t.Fatalf("%d rows dropped", n)
		}
		if _, err := json.Marshal(u); err != nil {
			t.Fatalf("usage cannot be encoded: %v", err)
		}
		const tera = 1_000_000_000_000
		if g := u[0]; g.PromptTokens != 2*tera || g.CompletionTokens != 2*tera || g.TotalTokens != 3*tera || g.CostUSD != 3e9 {
			t.Fatalf("usage %+v: want each row's numbers clamped to 1e12 tokens and 1e9 USD", g)
		}
		r, err := s.GetRun(ctx, "run_neg")
		if err != nil || r.Usage == nil || *r.Usage != (domain.Usage{}) {
			t.Fatalf("run_neg usage %+v, %v; want zeros", r.Usage, err)
		}
	})

	// A bound between two microseconds (the history's resolution) keeps the
	// range [since, until) it names: a run at t0 is before t0+500ns.
	t.Run("sub-microsecond bounds", func(t *testing.T) {
		s := open(t, newDSN(t), edgestore.Options{})
		s.RecordRun(run("run_t0", "n1", "exec", "", domain.RunSucceeded, t0, nil))
		eventually(t, "the run", func() bool { _, err := s.GetRun(ctx, "run_t0"); return err == nil })
		half := t0.Add(500 * time.Nanosecond)
		if p, err := s.ListRuns(ctx, domain.RunQuery{Until: half}); err != nil || len(p.Runs) != 1 {
			t.Fatalf("until t0+500ns: %+v, %v; want run_t0", p.Runs, err)
		}
		if p, err := s.ListRuns(ctx, domain.RunQuery{Since: half}); err != nil || len(p.Runs) != 0 {
			t.Fatalf("since t0+500ns: %+v, %v; want nothing", p.Runs, err)
		}
		if u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByNode, Until: half}); err != nil || len(u) != 1 || u[0].Runs != 1 {
			t.Fatalf("usage until t0+500ns: %+v, %v", u, err)
		}
	})

	t.Run("a full queue drops rows and counts them", func(t *testing.T) {
		var dropped atomic.Int64
		s := open(t, newDSN(t), edgestore.Options{QueueSize: 1, FlushInterval: time.Hour, BatchSize: 1000,
			Dropped: func(n int) { dropped.Add(int64(n)) }})
		for i := range 50 {
			s.RecordRun(run(fmt.Sprintf("run_%d", i), "n1", "exec", "", domain.RunRunning, t0, nil))
		}
		if dropped.Load() == 0 {
			t.Fatal("no row was dropped with a queue of one and 50 rows")
		}
	})

	t.Run("concurrent writers", func(t *testing.T) {
		s := open(t, newDSN(t), edgestore.Options{})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					s.RecordRun(run(fmt.Sprintf("run_%d_%d", w, i), "n1", "exec", "", domain.RunSucceeded, t0, nil))
				}
			}()
		}
		wg.Wait()
		eventually(t, "100 runs", func() bool {
			p, _ := s.ListRuns(ctx, domain.RunQuery{Limit: 1000})
			return len(p.Runs) == 100
		})
	})
}

// A database that goes away costs rows (counted), never a caller: Record
// returns at once while the database is down.
func TestPostgresOutageDropsRows(t *testing.T) {
	srv, err := pgtest.Start()
	if errors.Is(err, pgtest.ErrUnavailable) {
		t.Skipf("skipping the PostgreSQL run: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	dsn, err := srv.NewDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var dropped atomic.Int64
	s := open(t, dsn, edgestore.Options{WriteTimeout: 2 * time.Second, Dropped: func(n int) { dropped.Add(int64(n)) }})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := range 10 {
		s.RecordRun(run(fmt.Sprintf("run_%d", i), "n1", "exec", "", domain.RunSucceeded, t0, nil))
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("recording blocked for %v with the database down", d)
	}
	eventually(t, "dropped rows counted", func() bool { return dropped.Load() >= 10 })
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	s.RecordRun(run("run_after", "n1", "exec", "", domain.RunSucceeded, t0, nil))
	eventually(t, "a row written after the database came back", func() bool {
		_, err := s.GetRun(context.Background(), "run_after")
		return err == nil
	})
}

// Two edges migrating one PostgreSQL database at once both succeed.
func TestPostgresConcurrentMigrations(t *testing.T) {
	dsn := pgtest.DSN(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := edgestore.Open(context.Background(), dsn)
			if err == nil {
				err = db.Close()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// The writer sleeps between flush intervals; a batch's worth of rows wakes
// it early, and Close writes what is still queued.
func TestFullBatchIsWrittenBeforeTheInterval(t *testing.T) {
	ctx := context.Background()
	path := sqliteDSN(t)
	s := open(t, path, edgestore.Options{BatchSize: 4, FlushInterval: time.Hour})
	for i := range 4 {
		s.RecordRun(run(fmt.Sprintf("run_full%d", i), "n1", "exec", "k", domain.RunRunning, t0, nil))
	}
	// Read beside the store: its own reads would have the rows written
	// (settle), whether a full batch wakes the writer or not.
	beside, err := sql.Open(sqliteshim.ShimName, "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer beside.Close()
	eventually(t, "a full batch written", func() bool {
		var n int
		return beside.QueryRowContext(ctx, "SELECT COUNT(*) FROM edge_runs").Scan(&n) == nil && n == 4
	})

	dsn := sqliteDSN(t)
	s2 := open(t, dsn, edgestore.Options{BatchSize: 1024, FlushInterval: time.Hour})
	s2.RecordRun(run("run_closing", "n1", "exec", "k", domain.RunRunning, t0, nil))
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	again := open(t, dsn, edgestore.Options{})
	if _, err := again.GetRun(ctx, "run_closing"); err != nil {
		t.Fatalf("the row queued at Close: %v", err)
	}
}

// A PostgreSQL DSN the driver cannot use fails Open with an error, not the
// driver's panic, and the error never holds the DSN or its password.
func TestOpenBadPostgresDSNFailsWithoutThePassword(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "not-a-ca.pem")
	if err := os.WriteFile(notPEM, []byte("s3cretPW"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{
		"postgres://iop:s3cr%zzPW@127.0.0.1:1/iop",
		"postgres://iop:s3cretPW@127.0.0.1:1/iop?sslmode=maybe",
		"postgres://iop:s3cretPW@127.0.0.1:1/iop?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
		"postgres://iop:s3cretPW@127.0.0.1:1/iop?sslrootcert=" + notPEM,
		"postgres://iop:s3cretPW@127.0.0.1:1/iop?sslmode=require&sslcert=/nonexistent/c.pem&sslkey=/nonexistent/k.pem",
		"postgres://:s3cretPW@127.0.0.1:1/iop",
		"postgres://iop:s3cretPW@127.0.0.1:1/iop?timeout=soon",
	} {
		var db *edgestore.DB
		var err error
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("Open panicked: %v", r)
				}
			}()
			db, err = edgestore.Open(context.Background(), dsn)
		}()
		if err == nil {
			_ = db.Close()
			t.Fatalf("%s: opened", dsn)
		}
		if msg := err.Error(); strings.Contains(msg, "s3cr") || strings.Contains(msg, "PW") {
			t.Fatalf("error quotes the password: %s", msg)
		}
		t.Log(err)
	}
}

// RunQuery.Own lists the rows this edge wrote. On PostgreSQL, which edges
// may share, those are the rows of the store's edge id (as written: an id
// past the column's 255 characters is cut there); an SQLite file is one
// edge's, so all of its rows are, also those of an earlier host name.
func TestListOwnRuns(t *testing.T) {
	mine := strings.Repeat("e", 300)
	for _, tc := range []struct {
		name            string
		newDSN          opener
		ownRuns, second string // second: the second page of one run
	}{
		{"sqlite", sqliteDSN, "[run_mine2 run_other run_mine]", "[run_other]"},
		{"postgres", func(t *testing.T) string { return pgtest.DSN(t) }, "[run_mine2 run_mine]", "[run_mine]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dsn := tc.newDSN(t)
			s := open(t, dsn, edgestore.Options{EdgeID: mine})
			other := open(t, dsn, edgestore.Options{EdgeID: "edge-b"})
			s.RecordRun(run("run_mine", "n1", "exec", "k", domain.RunRunning, t0, nil))
			other.RecordRun(run("run_other", "n1", "exec", "k", domain.RunRunning, t0.Add(time.Minute), nil))
			s.RecordRun(run("run_mine2", "n1", "exec", "k", domain.RunRunning, t0.Add(2*time.Minute), nil))
			s.RecordRun(run("run_mine_n2", "n2", "exec", "k", domain.RunRunning, t0.Add(3*time.Minute), nil))
			eventually(t, "the rows of both edges", func() bool {
				p, err := s.ListRuns(context.Background(), domain.RunQuery{})
				return err == nil && len(p.Runs) == 4
			})
			running := domain.RunQuery{Node: "n1", Status: domain.RunRunning}
			wantRunIDs(t, s, running, "[run_mine2 run_other run_mine]")
			own := running
			own.Own = true
			wantRunIDs(t, s, own, tc.ownRuns)
			// Paged, the cursor goes on within the edge's rows.
			own.Limit = 1
			p, err := s.ListRuns(context.Background(), own)
			if err != nil || p.Next == "" {
				t.Fatalf("first page %+v, %v; want a next", p, err)
			}
			own.Cursor = p.Next
			wantRunIDs(t, s, own, tc.second)
			// A row read back names the edge that wrote it (a cancel
			// through another edge says which one to ask).
			for id, want := range map[string]string{"run_mine": s.EdgeID(), "run_other": "edge-b"} {
				if r, err := s.GetRun(context.Background(), id); err != nil || r.Edge != want {
					t.Errorf("GetRun(%s).Edge = %q, %v; want %q", id, r.Edge, err, want)
				}
			}
			if len(s.EdgeID()) != 255 {
				t.Errorf("EdgeID() is %d bytes, want the 255 stored", len(s.EdgeID()))
			}
		})
	}
}

// A read through the store sees every row recorded before it, without
// waiting for the writer's interval: "iop runs" right after a run was
// started or cancelled listed it as it was up to 200 ms before, or not at
// all.
func TestReadsSeeWhatWasRecordedBeforeThem(t *testing.T) {
	ctx := context.Background()
	s := open(t, sqliteDSN(t), edgestore.Options{FlushInterval: time.Hour})
	s.RecordRun(run("run_rw", "n1", "exec", "k", domain.RunRunning, t0, nil))
	if got, err := s.GetRun(ctx, "run_rw"); err != nil || got.Status != domain.RunRunning {
		t.Fatalf("GetRun right after it was recorded: %+v, %v", got, err)
	}
	s.RecordRun(run("run_rw", "n1", "exec", "k", domain.RunCancelled, t0, nil))
	p, err := s.ListRuns(ctx, domain.RunQuery{})
	if err != nil || len(p.Runs) != 1 || p.Runs[0].Status != domain.RunCancelled {
		t.Fatalf("ListRuns right after the run was cancelled: %+v, %v", p.Runs, err)
	}
	s.RecordTunnel(domain.TunnelRecord{ID: "tun_rw", Node: "n1", Provider: "p", Model: "m", Key: "k", Status: 200,
		StartedAt: t0, FinishedAt: t0, Usage: &domain.Usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}})
	u, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByNode})
	if err != nil || len(u) != 1 || u[0].TotalTokens != 7 {
		t.Fatalf("Usage right after a tunnel was recorded: %+v, %v", u, err)
	}

	// A closed store's read does not wait for a writer that is gone.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _, _ = s.GetRun(ctx, "run_rw") }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a read on a closed store hung")
	}
}
