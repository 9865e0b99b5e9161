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
