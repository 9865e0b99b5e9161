// Package spawn starts the node's child processes so that they do not outlive
// the node: each child leads a process group of its own (so stopping it
// signals everything it spawned), on Linux the kernel SIGKILLs the leader
// when the node dies (Pdeathsig), the node kills every live group when it
// shuts down, and the groups are recorded in a file so that a node started
// after a crash kills whatever an earlier one left running (descendants that
// the leader's death signal does not reach).
//
// Every runtime adapter that starts a process goes through Start.
package spawn

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Group is a started child's process group. Release it once the child has
// been waited for and its group killed.
type Group struct {
	pgid  int
	start uint64 // the leader's start time (clock ticks since boot), 0 if unknown
}

// PGID returns the process group id (the child's pid).
func (g *Group) PGID() int { return g.pgid }

// Release forgets the group: the node no longer kills it at shutdown or
// after a crash. Idempotent.
func (g *Group) Release() {
	reg.mu.Lock()
	_, ok := reg.live[g.pgid]
	if ok {
		delete(reg.live, g.pgid)
		reg.saveLocked()
	}
	reg.mu.Unlock()
	if ok {
		stopIfIdle()
	}
}

// registry is the set of live groups and the file they are recorded in.
var reg = &registry{live: map[int]*Group{}}

type registry struct {
	mu   sync.Mutex
	live map[int]*Group
	file string
}

// Start starts cmd as the leader of a new process group that dies with the
// node. It overwrites cmd.SysProcAttr.
func Start(cmd *exec.Cmd) (*Group, error) {
	cmd.SysProcAttr = sysProcAttr()
	spawner.mu.Lock()
	defer spawner.mu.Unlock()
	if err := startLocked(cmd); err != nil {
		stopIfIdleLocked()
		return nil, err
	}
	g := &Group{pgid: cmd.Process.Pid, start: startTime(cmd.Process.Pid)}
	reg.mu.Lock()
	reg.live[g.pgid] = g
	reg.saveLocked()
	reg.mu.Unlock()
	return g, nil
}

// KillAll SIGKILLs every live group; the node calls it when it stops.
func KillAll() {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	for pgid := range reg.live {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// Record makes path the file the live groups are recorded in, after killing
// the groups an earlier node left recorded there. It returns how many groups
// it killed. An empty path records nothing.
func Record(path string) (int, error) {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	killed := 0
	if path != "" {
		left, err := load(path)
		if err != nil {
			return 0, err
		}
		for _, g := range left {
			if stale(g) {
				_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
				killed++
			}
		}
	}
	reg.file = path
	reg.saveLocked()
	return killed, nil
}

// saveLocked rewrites the record file (write and rename, so a crash leaves
// the old or the new list, never half of one).
func (r *registry) saveLocked() {
	if r.file == "" {
		return
	}
	var b strings.Builder
	for _, pgid := range slices.Sorted(maps.Keys(r.live)) {
		fmt.Fprintf(&b, "%d %d\n", pgid, r.live[pgid].start)
	}
	tmp := r.file + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err == nil {
		_ = os.Rename(tmp, r.file)
	}
}

func load(path string) ([]*Group, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("child process record: %w", err)
	}
	defer f.Close()
	var out []*Group
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		pgid, err1 := strconv.Atoi(fields[0])
		st, err2 := strconv.ParseUint(fields[1], 10, 64)
		if err1 != nil || err2 != nil || pgid <= 1 {
			continue
		}
		out = append(out, &Group{pgid: pgid, start: st})
	}
	return out, sc.Err()
}

// RecordFileFor returns the record file kept next to a node database file
// ("" for an in-memory database).
func RecordFileFor(dbPath string) string {
	if dbPath == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(dbPath), filepath.Base(dbPath)+".children")
}
