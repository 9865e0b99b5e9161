// Package spawn starts the node's child processes so that nothing they start
// outlives the run they serve or the node: each child leads a session of
// its own (so a process group whose id is its pid), without a controlling
// terminal, and when it exits (or is stopped) everything it left running
// is killed — its group, and the descendants it placed in groups and
// sessions of their own (an agent's tool commands, which the CLIs run with
// setsid), found by their parent links in /proc while it lives and, once
// the node has called Adopt, among the orphans the kernel then hands the
// node rather than init. On Linux the kernel SIGKILLs the leader when the
// node dies (Pdeathsig), the node kills every live group (and what they
// started) when it shuts down, and the groups are recorded in a file so that
// a node started after a crash kills whatever an earlier one left running
// in them (descendants that the leader's death signal does not reach).
//
// Every runtime adapter that starts a process goes through Start, and waits
// for it with Group.Wait.
package spawn

import (
	"bytes"
	"cmp"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
)

// Group is a started child's process group, and the processes it starts.
// Wait for the child with Wait, then Release the group.
type Group struct {
	pgid int
	// The leader's start time (clock ticks since boot, as /proc/PID/stat
	// field 22 has it) lies in [start, startMax]; 0 if unknown.
	start, startMax uint64

	cmd *exec.Cmd
	// tagged is "\x00" + TagEnv + "=" + this child's tag + "\x00": how its
	// environment (/proc/PID/environ) shows it, and its descendants'
	// unless they changed theirs.
	tagged []byte

	// exited is closed once the leader is known to have exited (Wait
	// has seen it exit; what it left may still be being killed).
	exited chan struct{}

	mu     sync.Mutex
	seen   map[int]uint64 // pid -> start time of the descendants found so far
	reaped bool           // Wait has killed what the leader left: Signal is a no-op
}

// TagEnv is the variable Start adds to each child's environment, with a
// value unique to the child among the node's, so that the node knows a
// process that left the child's tree (an orphan) as one of the child's.
const TagEnv = "IOP_NODE_CHILD"

// tags numbers the children, for their tag.
var tags atomic.Uint64

// PGID returns the process group id (the child's pid).
func (g *Group) PGID() int { return g.pgid }

// Release forgets the group: the node no longer kills it at shutdown or
// after a crash. Idempotent, and a no-op once a later child has the
// group's id (Wait reaped the leader, and the kernel gave its pid to the
// next child): that child's group is not this one.
func (g *Group) Release() {
	// Only the release that empties the registry can let the spawner stop,
	// so the others do not queue behind a fork for its lock.
	if removed, idle := reg.remove(g); removed && idle {
		stopIfIdle()
	}
}

// registry is the set of live groups and the file they are recorded in.
//
// The file is a log, one line per change: "PGID START [START_MAX]" when a
// group starts (START_MAX when it differs from START), "-PGID" when it is
// released; replaying it gives the live set. Each change
// is one append (one write system call, no rename), and the file is
// rewritten to just the live set (write and rename, so a crash leaves the
// old or the new file, never half of one) when it opens, when the log has
// grown to several times the live set, and after an append fails. Like the
// rename before it, nothing is fsynced: the record is for a node process
// that crashed (kill -9, OOM), whose writes the kernel still holds; after a
// power loss no child survives to be killed.
type registry struct {
	mu    sync.Mutex
	live  map[int]*Group
	file  string
	f     *os.File // file, open for appending; nil when file is "" or needs rewriting
	lines int      // lines in file
	buf   []byte   // the line being appended
}

var reg = &registry{live: map[int]*Group{}}

// compactSlack is how many lines beyond the live set's four times the log
// may hold before it is rewritten: enough that a node with few children
// rewrites once per some hundred runs, not per run.
const compactSlack = 256

// Start starts cmd as the leader of a new session and process group (its
// pid is their id), without a controlling terminal, that dies with the
// node. It overwrites cmd.SysProcAttr and adds TagEnv to cmd.Env (the
// node's own environment when cmd.Env is nil). A cmd.Dir that is missing
// or not a directory is an error naming it: with SysProcAttr set,
// os.StartProcess leaves it to the child, whose failed chdir is then
// reported as the program being missing ("fork/exec /usr/bin/true: no
// such file or directory").
func Start(cmd *exec.Cmd) (*Group, error) {
	if cmd.Dir != "" {
		st, err := os.Stat(cmd.Dir)
		switch {
		case err != nil:
			return nil, fmt.Errorf("work dir: %w", err)
		case !st.IsDir():
			return nil, fmt.Errorf("work dir %s is not a directory", cmd.Dir)
		}
	}
	cmd.SysProcAttr = sysProcAttr()
	tag := TagEnv + "=" + strconv.Itoa(os.Getpid()) + "." + strconv.FormatUint(tags.Add(1), 10)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	// Last, so it wins over a TagEnv the node itself inherited; clipped,
	// so the caller's slice is not written to.
	cmd.Env = append(slices.Clip(cmd.Env), tag)
	spawner.mu.Lock()
	defer spawner.mu.Unlock()
	lo, hi, err := startLocked(cmd)
	if err != nil {
		stopIfIdleLocked()
		return nil, err
	}
	g := &Group{pgid: cmd.Process.Pid, start: lo, startMax: hi, cmd: cmd, tagged: []byte("\x00" + tag + "\x00"), exited: make(chan struct{})}
	reg.add(g)
	return g, nil
}

// Signal sends sig to the child's process group and to every process of
// the child's outside it: its live descendants (the groups their leaders
// lead are signalled whole) and, in a process that called Adopt, its
// orphans (see Wait) with theirs. A no-op once Wait has killed them. Use it
// to stop a running child: SIGTERM, then SIGKILL if Wait has not returned
// after a grace period.
func (g *Group) Signal(sig syscall.Signal) { g.signal(sig) }

// Wait waits for the child to exit, SIGKILLs everything of its still
// running, and then returns what cmd.Wait returns. Call it once.
//
// Everything of the child's is: its process group; on Linux, the processes
// Signal found that still run, with their descendants; and in a process
// that called Adopt, the child's orphans — the processes reparented to
// this one that carry the child's TagEnv or are in its group, or, once no
// other child is live, any that started after the child did and is not in
// this process's own group (never the children this process had before
// Adopt, nor what they start) — with theirs. On Linux these are
// killed while the exited leader is not yet reaped (its pid, so its group
// id, cannot be reused meanwhile), so an output pipe one of them held is
// closed by the time cmd.Wait waits for it, and Wait returns once they are
// gone (reaped, those that became this process's children), waiting at
// most a couple of seconds for any slow to die. Elsewhere only the group
// is killed.
func (g *Group) Wait() error { return g.wait() }

// Exited returns a channel closed once Wait has seen the child exit: on
// its own, unless it had been signalled. Wait returns after, once what the
// child left is gone and its output read.
func (g *Group) Exited() <-chan struct{} { return g.exited }

// KillAll SIGKILLs every live group and, on Linux, every process they
// started and every orphan the node adopted that may be theirs (started
// after Adopt, not in this process's own group, not a child this process
// had before Adopt nor started by one), and reaps those orphans; the node
// calls it when it stops. A group whose Wait has reaped its leader is
// skipped, although it is live until Released: Wait has killed what the
// leader left, and the leader's pid, so the group's id, may now name an
// unrelated process.
//
// The groups it can lock at once are killed first, together, so that a
// group another call holds (a Wait still killing a slow-to-die leftover,
// for up to reapWait) delays no other: the node's forced stop gives
// KillAll a second at most.
func KillAll() {
	reg.mu.Lock()
	all := slices.SortedFunc(maps.Values(reg.live), func(a, b *Group) int { return cmp.Compare(a.pgid, b.pgid) })
	reg.mu.Unlock()
	// A group is killed only under its lock, with reaped not set: Wait
	// reaps the leader only after reap has set reaped under the lock, so
	// meanwhile the leader's pid is the leader's (alive, or a zombie) and
	// the group's id is this group's. Locks are only tried while others
	// are held (so two KillAll calls cannot deadlock), and none is held
	// while the killed are awaited.
	var held, busy []*Group
	for _, g := range all {
		if !g.mu.TryLock() {
			busy = append(busy, g)
			continue
		}
		if g.reaped {
			g.mu.Unlock()
			continue
		}
		held = append(held, g)
		_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
	}
	killed := killAll(held)
	for _, g := range held {
		g.mu.Unlock()
	}
	// The rest one at a time, once their holder lets go: a Wait's reap
	// has killed the group by then (and set reaped), a Signal has not.
	for _, g := range busy {
		g.mu.Lock()
		if !g.reaped {
			_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
			killed = append(killed, killAll([]*Group{g})...)
		}
		g.mu.Unlock()
	}
	awaitKilled(killed)
}

// Record makes path the file the live groups are recorded in, after killing
// the groups an earlier node left recorded there. It returns how many groups
// it killed. An empty path records nothing.
//
// The caller must be the only process using path: the groups of a node
// still running look just like those a crashed one left, so Record would
// kill them. iop-node holds its store's lock (sqlite.LockFile) first.
func Record(path string) (int, error) {
	return reg.record(path)
}

func (r *registry) record(path string) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
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
	r.closeLocked()
	r.file = path
	r.rewriteLocked()
	return killed, nil
}

// add makes g live and records it. A group live with the same id is one
// whose leader Wait has reaped (a pid is not reused before), not yet
// released: g replaces it, and its release is then a no-op (see remove).
func (r *registry) add(g *Group) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live[g.pgid] = g
	r.startedLocked(g)
}

// remove forgets g and records that, if g is the live group with its id
// (not one a later child with the same pid replaced, whose group must stay
// recorded and killable); it reports whether it removed g and whether the
// registry is now empty.
func (r *registry) remove(g *Group) (removed, idle bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live[g.pgid] == g {
		delete(r.live, g.pgid)
		r.releasedLocked(g.pgid)
		removed = true
	}
	return removed, len(r.live) == 0
}

// startedLocked records g, which is already in r.live.
func (r *registry) startedLocked(g *Group) {
	r.appendLocked(appendStarted(r.buf[:0], g))
}

// appendStarted appends g's start line to b.
func appendStarted(b []byte, g *Group) []byte {
	b = strconv.AppendInt(b, int64(g.pgid), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, g.start, 10)
	if g.startMax != g.start {
		b = append(b, ' ')
		b = strconv.AppendUint(b, g.startMax, 10)
	}
	return append(b, '\n')
}

// releasedLocked records that pgid, already gone from r.live, was released.
func (r *registry) releasedLocked(pgid int) {
	b := append(r.buf[:0], '-')
	b = strconv.AppendInt(b, int64(pgid), 10)
	r.appendLocked(append(b, '\n'))
}

// appendLocked appends one line to the file, or rewrites the file when it is
// due for compaction or the append fails (a short write could leave a torn
// line for the next append to complete into a wrong one).
func (r *registry) appendLocked(line []byte) {
	r.buf = line[:0]
	if r.file == "" {
		return
	}
	if r.f == nil || r.lines >= 4*len(r.live)+compactSlack {
		r.rewriteLocked()
		return
	}
	if n, err := r.f.Write(line); err != nil || n != len(line) {
		r.rewriteLocked()
		return
	}
	r.lines++
}

// rewriteLocked replaces the file with the live set and reopens it for
// appending. On failure the file is left as it was and the next change tries
// again.
func (r *registry) rewriteLocked() {
	r.closeLocked()
	if r.file == "" {
		return
	}
	var b []byte
	for _, pgid := range slices.Sorted(maps.Keys(r.live)) {
		b = appendStarted(b, r.live[pgid])
	}
	tmp := r.file + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return
	}
	if err := os.Rename(tmp, r.file); err != nil {
		return
	}
	f, err := os.OpenFile(r.file, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return
	}
	r.f, r.lines = f, len(r.live)
}

func (r *registry) closeLocked() {
	if r.f != nil {
		_ = r.f.Close()
		r.f = nil
	}
}

// load replays a record file into the groups it leaves live. Lines it cannot
// parse are skipped, and so is a last line without its newline (a write cut
// short).
func load(path string) ([]*Group, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("child process record: %w", err)
	}
	live := map[int]*Group{}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		line := b[:i]
		b = b[i+1:]
		if rest, ok := bytes.CutPrefix(line, []byte{'-'}); ok {
			if pgid, err := strconv.Atoi(string(rest)); err == nil {
				delete(live, pgid)
			}
			continue
		}
		fields := bytes.Fields(line)
		if len(fields) != 2 && len(fields) != 3 {
			continue
		}
		pgid, err1 := strconv.Atoi(string(fields[0]))
		st, err2 := strconv.ParseUint(string(fields[1]), 10, 64)
		stMax, err3 := st, error(nil)
		if len(fields) == 3 {
			stMax, err3 = strconv.ParseUint(string(fields[2]), 10, 64)
		}
		if err1 != nil || err2 != nil || err3 != nil || pgid <= 1 || stMax < st {
			continue
		}
		live[pgid] = &Group{pgid: pgid, start: st, startMax: stMax}
	}
	out := make([]*Group, 0, len(live))
	for _, pgid := range slices.Sorted(maps.Keys(live)) {
		out = append(out, live[pgid])
	}
	return out, nil
}

// RecordFileFor returns the record file kept next to a node database file
// ("" for an in-memory database).
func RecordFileFor(dbPath string) string {
	if dbPath == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(dbPath), filepath.Base(dbPath)+".children")
}
