//go:build unix

package spawn

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"iop/adapters/runtime/runtimetest"
)

// rewriteEveryChange is how the registry recorded groups before the log:
// the whole live set written to a temporary file and renamed over the
// record on every start and release. Kept as the benchmark's baseline.
func rewriteEveryChange(file string, live map[int]*Group) {
	var b strings.Builder
	for _, pgid := range slices.Sorted(maps.Keys(live)) {
		fmt.Fprintf(&b, "%d %d\n", pgid, live[pgid].start)
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err == nil {
		_ = os.Rename(tmp, file)
	}
}

// BenchmarkRecordStartRelease records one child's start and release with 32
// others live (the load tool's 32 concurrent runs): the file rewritten per
// change (before) against the appended log.
func BenchmarkRecordStartRelease(b *testing.B) {
	const others = 32
	b.Run("rewrite-per-change", func(b *testing.B) {
		file := filepath.Join(b.TempDir(), "node.db.children")
		live := map[int]*Group{}
		for i := range others {
			live[fakePGID+i] = &Group{pgid: fakePGID + i, start: 1234567, startMax: 1234568}
		}
		pgid := fakePGID + others
		runtimetest.ReportCPU(b, func() {
			for b.Loop() {
				live[pgid] = &Group{pgid: pgid, start: 1234567, startMax: 1234568}
				rewriteEveryChange(file, live)
				delete(live, pgid)
				rewriteEveryChange(file, live)
			}
		})
	})
	b.Run("append-log", func(b *testing.B) {
		r, _ := newRecorded(b)
		for i := range others {
			r.add(&Group{pgid: fakePGID + i, start: 1234567, startMax: 1234568})
		}
		pgid := fakePGID + others
		runtimetest.ReportCPU(b, func() {
			for b.Loop() {
				g := &Group{pgid: pgid, start: 1234567, startMax: 1234568}
				r.add(g)
				r.remove(g)
			}
		})
	})
}
