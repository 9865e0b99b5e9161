package node_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"iop/adapters/store/memory"
	"iop/adapters/store/sqlite"
	"iop/application/node"
	"iop/domain"
	"iop/domain/nodecmd"
	"iop/ports"
)

// runsStores are the node's run stores the runs command pages over: the
// SQLite file a node keeps, and the in-memory fake of the use-case tests.
func runsStores() map[string]func(t *testing.T) ports.RunStore {
	return map[string]func(t *testing.T) ports.RunStore{
		"sqlite": func(t *testing.T) ports.RunStore {
			db, err := sqlite.Open(context.Background(), "file:"+filepath.Join(t.TempDir(), "iop.db")+"?cache=shared&mode=rwc")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			return sqlite.NewRunStore(db)
		},
		"memory": func(*testing.T) ports.RunStore { return memory.NewRunStore() },
	}
}

// runsCommand is a CommandHandler over store.
func runsCommand(t *testing.T, store ports.RunStore) func(args string) (nodecmd.RunList, error) {
	t.Helper()
	n := newUCNode(t, map[string]ports.RuntimeAdapter{"exec": newUCAdapter("exec", domain.Capabilities{MaxConcurrency: 1}, nil)})
	cmds := node.NewCommandHandler(n.rt, n.runs, node.NewSessionHandler(n.rt, n.runs), store, "v")
	return func(args string) (nodecmd.RunList, error) {
		raw, err := cmds.RunCommand(context.Background(), node.CmdRuns, []byte(args), nil)
		if err != nil {
			return nodecmd.RunList{}, err
		}
		return ucDecode[nodecmd.RunList](t, raw), nil
	}
}

func seedRun(t *testing.T, s ports.RunStore, id, adapter string, at time.Time, fail bool) {
	t.Helper()
	r, err := domain.NewRun(ucReq(id, adapter, "t"), at)
	if err != nil {
		t.Fatal(err)
	}
	if fail {
		if err := r.Start(at); err != nil {
			t.Fatal(err)
		}
		if err := r.Finish(domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{Code: "x"}}, at); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateRun(context.Background(), r); err != nil {
		t.Fatal(err)
	}
}

// The runs command answers a page at a time with a cursor to the next, so
// a node's whole store can be read however many runs it holds: before, a
// listing stopped at 1000 runs with no way on. Pages hold newest first,
// runs created at the same instant included, and runs added between pages
// neither repeat nor hide others.
func TestRunsCommandPages(t *testing.T) {
	for name, newStore := range runsStores() {
		t.Run(name, func(t *testing.T) {
			ucNoLeaks(t)
			s := newStore(t)
			list := runsCommand(t, s)
			base := time.Date(2026, 5, 1, 10, 0, 0, 123_456_789, time.UTC)
			// 40 exec runs, five created at each of 8 instants; every third
			// failed; and chat runs at the same instants, filtered out.
			for i := range 40 {
				at := base.Add(time.Duration(i/5) * time.Second)
				seedRun(t, s, fmt.Sprintf("e%02d", i), "exec", at, i%3 == 0)
				if i%5 == 0 {
					seedRun(t, s, fmt.Sprintf("c%02d", i), "chat", at, false)
				}
			}
			args := `{"adapter":"exec","limit":7}`
			var got []nodecmd.Run
			for pages := 0; ; pages++ {
				if pages > 10 {
					t.Fatal("no end after 10 pages")
				}
				l, err := list(args)
				if err != nil {
					t.Fatalf("%s: %v", args, err)
				}
				if len(l.Runs) > 7 || (l.NextCursor != "" && len(l.Runs) != 7) {
					t.Fatalf("%s: page of %d runs, next %q; want pages of 7", args, len(l.Runs), l.NextCursor)
				}
				got = append(got, l.Runs...)
				if pages == 0 {
					// Meanwhile: a newer run (after the listing's start, not
					// in it) and one older than the cursor (listed later).
					seedRun(t, s, "e98", "exec", base.Add(time.Hour), false)
					seedRun(t, s, "e99", "exec", base.Add(-time.Hour), false)
				}
				if l.NextCursor == "" {
					break
				}
				b, _ := json.Marshal(map[string]any{"adapter": "exec", "limit": 7, "cursor": l.NextCursor})
				args = string(b)
			}
			var ids []string
			for _, r := range got {
				ids = append(ids, r.RunID)
			}
			var want []string
			for i := 39; i >= 0; i-- {
				want = append(want, fmt.Sprintf("e%02d", i))
			}
			want = append(want, "e99")
			if strings.Join(ids, " ") != strings.Join(want, " ") {
				t.Fatalf("pages listed\n%v\nwant\n%v", ids, want)
			}

			// A page that ends the listing exactly has no cursor; nor has
			// one of a filter matching fewer runs than it holds.
			if l, err := list(`{"status":"failed","limit":14}`); err != nil || len(l.Runs) != 14 || l.NextCursor != "" {
				t.Fatalf("14 failed runs in a page of 14: %d runs, next %q, %v; want no next page", len(l.Runs), l.NextCursor, err)
			}
			if l, err := list(`{"status":"failed","limit":13}`); err != nil || len(l.Runs) != 13 || l.NextCursor == "" {
				t.Fatalf("14 failed runs in a page of 13: %d runs, next %q, %v; want a next page", len(l.Runs), l.NextCursor, err)
			} else if l, err := list(`{"status":"failed","limit":13,"cursor":"` + l.NextCursor + `"}`); err != nil || len(l.Runs) != 1 || l.Runs[0].RunID != "e00" || l.NextCursor != "" {
				t.Fatalf("the last failed run: %+v, %v", l, err)
			}
			// No limit: a page of 50, here every run.
			if l, err := list(``); err != nil || len(l.Runs) != 50 || l.NextCursor != "" || l.Runs[0].RunID != "e98" {
				t.Fatalf("default page: %d runs from %v, next %q, %v", len(l.Runs), l.Runs, l.NextCursor, err)
			}
		})
	}
}

// A page holds at most 1000 runs, and one of more asked for still has a
// cursor to the rest.
func TestRunsCommandCapsThePage(t *testing.T) {
	ucNoLeaks(t)
	s := memory.NewRunStore()
	base := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	for i := range 1001 {
		seedRun(t, s, fmt.Sprintf("r%04d", i), "exec", base.Add(time.Duration(i%3)*time.Millisecond), false)
	}
	list := runsCommand(t, s)
	l, err := list(`{"limit":5000}`)
	if err != nil || len(l.Runs) != 1000 || l.NextCursor == "" {
		t.Fatalf("limit 5000 of 1001 runs: %d runs, next %q, %v; want 1000 and a cursor", len(l.Runs), l.NextCursor, err)
	}
	rest, err := list(`{"limit":5000,"cursor":"` + l.NextCursor + `"}`)
	if err != nil || len(rest.Runs) != 1 || rest.NextCursor != "" || rest.Runs[0].RunID != "r0000" {
		t.Fatalf("the rest: %+v, %v; want r0000 alone", rest, err)
	}
}

// A cursor the node did not return from runs is invalid_request, named as
// the cursor: never a store error (a 500) nor a silent first page.
func TestRunsCommandRefusesForeignCursors(t *testing.T) {
	for name, newStore := range runsStores() {
		t.Run(name, func(t *testing.T) {
			ucNoLeaks(t)
			s := newStore(t)
			seedRun(t, s, "r1", "exec", time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC), false)
			list := runsCommand(t, s)
			b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
			for _, c := range []string{
				"nope!",
				b64(`[1767225600000000,"chat","s1"]`), // a session_list cursor
				b64("1767225600000000|r1"),            // an edge's GET /v1/runs cursor
				b64(`["runs","n1","2026-05-01T10:00:00Z"]`),
				b64(`["runs","2026-05-01T10:00:00Z","r1"]`),
				b64(`["runs","n1","yesterday","r1"]`),
				b64(`["runs","n1","2026-05-01T10:00:00Z",""]`),
				b64(`["runs","n1","2026-05-01T10:00:00Z","r\u0000"]`),
				b64(`["sessions","n1","2026-05-01T10:00:00Z","r1"]`),
				b64(`["runs","n2","2026-05-01T10:00:00Z","r1"]`), // another node's
				b64(`["runs","","2026-05-01T10:00:00Z","r1"]`),
				b64(`{"runs":1}`),
				strings.Repeat("A", 5000),
			} {
				args, _ := json.Marshal(map[string]string{"cursor": c})
				_, err := list(string(args))
				if !errors.Is(err, domain.ErrInvalidRequest) || !strings.Contains(err.Error(), "cursor") || len(err.Error()) > 400 {
					t.Errorf("cursor %.40q: %v; want invalid_request naming the cursor", c, err)
				}
			}
			// The node's own cursor of the same shape is a position.
			if l, err := list(`{"cursor":"` + b64(`["runs","n1","2026-05-01T10:00:01Z","r1"]`) + `"}`); err != nil || len(l.Runs) != 1 {
				t.Fatalf("this node's cursor: %+v, %v; want r1", l, err)
			}
		})
	}
}
