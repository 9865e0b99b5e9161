package edgestore

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/uptrace/bun"

	"iop/adapters/store/pgtest"
	"iop/domain"
)

// A history made before tunnels recorded the response they create
// (schema 3) is migrated in place as the edge starts: its tunnels stay,
// and the responses created from then on are found through an index.
func TestMigrationAddsTheResponseOfATunnel(t *testing.T) {
	for name, newDSN := range map[string]func() string{
		"sqlite":   func() string { return filepath.Join(t.TempDir(), "edge.db") },
		"postgres": func() string { return pgtest.DSN(t) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dsn := newDSN()
			db, err := Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			// Back to schema 3, as an edge before migration 4 left it, with
			// a tunnel written then.
			for _, q := range append(schema3,
				"INSERT INTO edge_tunnels (id, edge_id, node, provider, model, path, key_name, status, error_code, body_bytes, "+
					"prompt_tokens, completion_tokens, total_tokens, cost_usd, started_us, finished_us) "+
					"VALUES ('tun_old', 'e1', 'n1', 'p1', 'm', '/v1/responses', 'alice', 200, '', 10, 1, 2, 3, 0, 1, 2)",
			) {
				if _, err := db.bun.ExecContext(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}

			db, err = Open(ctx, dsn)
			if err != nil {
				t.Fatalf("Open on a schema 3 history: %v", err)
			}
			s := New(db, Options{EdgeID: "e1", Retention: -1, FlushInterval: 10 * time.Millisecond})
			defer s.Close()
			var version int
			if err := db.bun.NewSelect().Table("edge_schema_migrations").ColumnExpr("max(version)").Scan(ctx, &version); err != nil || version != Version() || version < 4 {
				t.Fatalf("schema version %d, %v; want %d", version, err, Version())
			}
			// Written in order: once tun_new is found, tun_chat is there.
			s.RecordTunnel(domain.TunnelRecord{ID: "tun_chat", Node: "n2", Provider: "p2", Key: "bob", Path: "/v1/chat/completions",
				Status: 200, StartedAt: time.UnixMicro(4), FinishedAt: time.UnixMicro(6)})
			s.RecordTunnel(domain.TunnelRecord{ID: "tun_new", Node: "n2", Provider: "p2", Key: "bob", Path: "/v1/responses",
				Status: 200, StartedAt: time.UnixMicro(5), FinishedAt: time.UnixMicro(6), Response: "resp_new"})
			var got domain.TunnelRecord
			deadline := time.Now().Add(10 * time.Second)
			for {
				r, found, err := s.ResponseOrigin(ctx, "resp_new")
				if err != nil {
					t.Fatal(err)
				}
				if found {
					got = r
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the new tunnel's response was never found")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got.ID != "tun_new" || got.Node != "n2" || got.Provider != "p2" || got.Key != "bob" {
				t.Fatalf("resp_new: %+v, want tun_new's", got)
			}
			// The tunnel of before the migration is still there, and it and
			// one that created no response have none (NULL, out of the
			// index).
			totals, err := s.Usage(ctx, domain.UsageQuery{GroupBy: domain.GroupByKey})
			if err != nil {
				t.Fatal(err)
			}
			old := false
			for _, g := range totals {
				old = old || (g.Group == "alice" && g.Tunnels == 1 && g.TotalTokens == 3)
			}
			if !old {
				t.Fatalf("usage %+v lacks the tunnel written before the migration", totals)
			}
			var n int
			if err := db.bun.NewSelect().Table("edge_tunnels").ColumnExpr("count(*)").Where("response_id IS NULL").Scan(ctx, &n); err != nil || n != 2 {
				t.Fatalf("tunnels without a response: %d, %v; want tun_old and tun_chat", n, err)
			}

			// The lookup goes through the index, not the whole history.
			var rows []tunnelRow
			sel := db.responseQuery(&rows, "resp_x")
			var plan []string
			if db.postgres {
				err = db.bun.RunInTx(ctx, nil, func(ctx context.Context, tx bun.Tx) error {
					if _, err := tx.ExecContext(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
						return err
					}
					return tx.NewRaw("EXPLAIN "+sel.String()).Scan(ctx, &plan)
				})
			} else {
				plan, err = sqlitePlan(ctx, db, sel.String())
			}
			if err != nil {
				t.Fatal(err)
			}
			if p := strings.Join(plan, "\n"); !strings.Contains(p, "edge_tunnels_response_idx") {
				t.Fatalf("plan does not use edge_tunnels_response_idx:\n%s", p)
			}
		})
	}
}

// A recalled response's usage is for the recalling edge to count only when
// no tunnel counted it: not its creation (a background response's was
// queued, with no usage), nor a retrieval recorded as counting it
// (usage_of), and it is not another edge's — in a PostgreSQL history
// shared by edges; an SQLite file's responses are all its edge's, under
// whatever id it wrote them. The look-up of the retrieval goes through
// its index.
func TestResponseOriginSaysWhetherItsUsageWasCounted(t *testing.T) {
	for name, newDSN := range map[string]func() string{
		"sqlite":   func() string { return filepath.Join(t.TempDir(), "edge.db") },
		"postgres": func() string { return pgtest.DSN(t) },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			db, err := Open(ctx, newDSN())
			if err != nil {
				t.Fatal(err)
			}
			s := New(db, Options{EdgeID: "e1", Retention: -1, FlushInterval: 10 * time.Millisecond})
			defer s.Close()
			other := New(db, Options{EdgeID: "e2", Retention: -1, FlushInterval: 10 * time.Millisecond})
			defer other.Close()
			usage := &domain.Usage{PromptTokens: 8, CompletionTokens: 2, TotalTokens: 10}
			// After migration 5 was applied (Open): a response created
			// before it counts as counted, as every recalled one did then.
			base := time.Now().UnixMicro() + 1000
			at := func(us int64) (time.Time, time.Time) { return time.UnixMicro(base + us), time.UnixMicro(base + us + 1) }
			tunnel := func(st *Store, id string, us int64, u *domain.Usage, created, usageOf string) {
				start, end := at(us)
				st.RecordTunnel(domain.TunnelRecord{ID: id, Node: "n1", Provider: "p1", Key: "alice", Path: "/v1/responses", Status: 200,
					Usage: u, StartedAt: start, FinishedAt: end, Response: created, UsageOf: usageOf})
			}
			tunnel(s, "tun_now", 1, usage, "resp_now", "")                       // created with its usage
			tunnel(s, "tun_bg", 2, nil, "resp_bg", "")                           // background: queued
			tunnel(s, "tun_bg2", 3, nil, "resp_bg2", "")                         // background, then retrieved:
			tunnel(s, "tun_poll", 4, nil, "", "")                                // still queued
			tunnel(s, "tun_done", 5, usage, "", "resp_bg2")                      // completed, counted
			tunnel(other, "tun_e2", 6, nil, "resp_e2", "")                       // another edge's background response
			tunnel(s, "tun_old", -time.Hour.Microseconds(), nil, "resp_old", "") // before the upgrade: maybe counted
			tunnel(s, "tun_last", 7, nil, "resp_last", "")                       // written last: all are there once it is
			waitFor(t, func() bool { _, found, err := s.ResponseOrigin(ctx, "resp_last"); return err == nil && found })
			waitFor(t, func() bool { _, found, err := s.ResponseOrigin(ctx, "resp_e2"); return err == nil && found })
			want := map[string]bool{"resp_now": true, "resp_bg": false, "resp_bg2": true, "resp_e2": db.postgres, "resp_old": true}
			for id, counted := range want {
				r, found, err := s.ResponseOrigin(ctx, id)
				if err != nil || !found || r.UsageCounted != counted || r.Node != "n1" || r.Key != "alice" {
					t.Errorf("%s: %+v, %v, %v; want found, UsageCounted %v", id, r, found, err, counted)
				}
			}
			if !db.postgres {
				plan, err := sqlitePlan(ctx, db, db.usageOfQuery("resp_x").String())
				if err != nil {
					t.Fatal(err)
				}
				if p := strings.Join(plan, "\n"); !strings.Contains(p, "edge_tunnels_usage_of_idx") {
					t.Fatalf("plan does not use edge_tunnels_usage_of_idx:\n%s", p)
				}
			}
		})
	}
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}
