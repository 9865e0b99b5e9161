package spawn

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakePGID is above any Linux pid_max, so no process can have it: a record
// holding it is never killed, only replayed.
const fakePGID = 5_000_000

// recorded replays file as a restarted node would: "PGID@START" per live
// group, ascending, joined by spaces.
func recorded(t testing.TB, file string) string {
	t.Helper()
	groups, err := load(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, g := range groups {
		if g.startMax != g.start {
			out = append(out, fmt.Sprintf("%d@%d-%d", g.pgid, g.start, g.startMax))
			continue
		}
		out = append(out, fmt.Sprintf("%d@%d", g.pgid, g.start))
	}
	return strings.Join(out, " ")
}

func newRecorded(t testing.TB) (*registry, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "node.db.children")
	r := &registry{live: map[int]*Group{}}
	if _, err := r.record(file); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = r.record("") })
	return r, file
}

func TestRecordReplaysStartsAndReleases(t *testing.T) {
	r, file := newRecorded(t)
	var gs [3]*Group
	for i := range gs {
		gs[i] = &Group{pgid: fakePGID + i, start: uint64(10 + i), startMax: uint64(10 + i)}
		r.add(gs[i])
	}
	if removed, idle := r.remove(gs[1]); !removed || idle {
		t.Fatalf("remove = %v, %v; want removed, not idle", removed, idle)
	}
	if removed, _ := r.remove(gs[1]); removed {
		t.Fatal("a second remove of the same group removed it again")
	}
	// The same pgid again, as a new process: the later start wins.
	again := &Group{pgid: fakePGID + 1, start: 99, startMax: 101}
	r.add(again)
	r.remove(gs[0])
	want := fmt.Sprintf("%d@99-101 %d@12", fakePGID+1, fakePGID+2)
	if got := recorded(t, file); got != want {
		t.Fatalf("recorded %q; want %q", got, want)
	}
	r.remove(again)
	if removed, idle := r.remove(gs[2]); !removed || !idle {
		t.Fatalf("last remove = %v, %v; want removed and idle", removed, idle)
	}
	if got := recorded(t, file); got != "" {
		t.Fatalf("recorded %q after every release; want nothing", got)
	}
}

// The log is rewritten to the live set before it grows past a few times
// that set, so a long-lived node's file stays small.
func TestRecordCompacts(t *testing.T) {
	r, file := newRecorded(t)
	const live = 8
	for i := range live {
		r.add(&Group{pgid: fakePGID + i, start: 1, startMax: 1})
	}
	maxLines := 0
	for i := range 5000 {
		pgid := fakePGID + live + i
		g := &Group{pgid: pgid, start: 2, startMax: 3}
		r.add(g)
		r.remove(g)
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		maxLines = max(maxLines, bytes.Count(b, []byte{'\n'}))
	}
	if limit := 4*(live+1) + compactSlack + 1; maxLines > limit {
		t.Fatalf("the record grew to %d lines; want at most %d", maxLines, limit)
	}
	groups, err := load(file)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]int, 0, len(groups))
	for _, g := range groups {
		got = append(got, g.pgid)
	}
	if want := slices.Sorted(maps.Keys(r.live)); !slices.Equal(got, want) {
		t.Fatalf("replayed %v; want %v", got, want)
	}
}

// A group whose leader was reaped but that was not yet released, and whose
// pid the kernel gave to a later child: the later child's group replaces it,
// and its release then leaves that group live and recorded (and the
// registry not idle).
func TestRemoveOfAReplacedGroupIsANoOp(t *testing.T) {
	r, file := newRecorded(t)
	old := &Group{pgid: fakePGID, start: 10, startMax: 10}
	r.add(old)
	cur := &Group{pgid: fakePGID, start: 50, startMax: 50}
	r.add(cur)
	if removed, idle := r.remove(old); removed || idle {
		t.Fatalf("remove of the replaced group = %v, %v; want neither removed nor idle", removed, idle)
	}
	if r.live[fakePGID] != cur {
		t.Fatal("the replaced group's release removed the live one")
	}
	if got, want := recorded(t, file), fmt.Sprintf("%d@50", fakePGID); got != want {
		t.Fatalf("recorded %q; want %q", got, want)
	}
	if removed, idle := r.remove(cur); !removed || !idle {
		t.Fatalf("remove of the live group = %v, %v; want removed and idle", removed, idle)
	}
}

func TestLoadSkipsWhatItCannotParse(t *testing.T) {
	file := filepath.Join(t.TempDir(), "node.db.children")
	rec := fmt.Sprintf("%d 5\ngarbage\n%d x\n-zz\n%d 6 8\n%d 7\n-%d\n1 1\n%d 9 8\n%d 1 2 3\n-%d",
		fakePGID, fakePGID+1, fakePGID+2, fakePGID+3, fakePGID+3, fakePGID+4, fakePGID+5, fakePGID)
	if err := os.WriteFile(file, []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	// The torn last line ("-PGID" without its newline) is not applied, pid 1
	// is never a group of ours, a range that ends before it starts or a
	// fourth field is not a record, and the rest replays.
	want := fmt.Sprintf("%d@5 %d@6-8", fakePGID, fakePGID+2)
	if got := recorded(t, file); got != want {
		t.Fatalf("recorded %q; want %q", got, want)
	}
}
