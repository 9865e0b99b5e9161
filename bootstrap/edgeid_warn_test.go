package bootstrap_test

import (
	"strings"
	"testing"

	"iop/adapters/store/pgtest"
)

const warnDefaultEdgeID = "store.edge_id is not set: this edge's history rows carry its host name"

// An edge whose PostgreSQL history has no store.edge_id warns once at
// start: it settles only the running rows written under its own id, which
// its host name makes unstable. With an id, or on SQLite (one edge per
// file), it does not.
func TestEdgeWarnsOfADefaultEdgeIDOnPostgres(t *testing.T) {
	_, dsn := pgtest.Own(t)
	doc := func(store string) string {
		return `
transport: {listen: "127.0.0.1:0"}
http: {listen: "127.0.0.1:0"}
store: ` + store + `
`
	}
	if logs := startEdge(t, doc(`{dsn: "`+dsn+`"}`)); strings.Count(logs, warnDefaultEdgeID) != 1 || !strings.Contains(logs, `level=WARN msg="`+warnDefaultEdgeID) {
		t.Errorf("an edge on PostgreSQL without store.edge_id did not warn once:\n%s", logs)
	}
	if logs := startEdge(t, doc(`{dsn: "`+dsn+`", edge_id: edge-a}`)); strings.Contains(logs, warnDefaultEdgeID) {
		t.Errorf("an edge with store.edge_id warned:\n%s", logs)
	}
	if logs := startEdge(t, doc(`{dsn: "`+t.TempDir()+`/edge.db"}`)); strings.Contains(logs, warnDefaultEdgeID) {
		t.Errorf("an edge on SQLite warned:\n%s", logs)
	}
}
