package spawn

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// How a child's leftovers are found and killed (Group.Signal, Group.Wait,
// KillAll):
//
//   - While the leader lives, its descendants are its tree: the children
//     the kernel lists in /proc/PID/task/TID/children, followed down (a
//     full /proc scan of parent pids stands in on a kernel without those
//     files). Each is remembered (pid and start time), so a later signal
//     still reaches it once its parent is gone.
//   - A process whose parent exits is reparented to the nearest ancestor
//     that is a child subreaper: after Adopt, the node rather than init,
//     and the kernel hands it to the node's main thread (the first of its
//     threads alive, and Go never ends the main thread), so the node's
//     orphans are the children /proc/self/task/PID/children lists that
//     Start did not start, less those the node had before Adopt (a
//     sidecar its entrypoint shell started before exec-ing it) and what
//     these are seen to start, and less any that started before Adopt: an
//     inherited child is no run's. A child's orphans are those carrying its
//     tag in their environment (TagEnv) or in its process group; when no
//     other child is live, so is an orphan without a tag that started after
//     the child did and is not in the node's own process group (where the
//     processes its entrypoint started stay, and a run's never go). With
//     their own descendants.
//   - A process group is signalled as a whole (kill(-pgid)) only when it is
//     the child's own or its leader is one of the processes found: a group
//     can be joined only from inside its session, each child leads a
//     session of its own (Start), and a tool's group or session is made by
//     the tool. Any other process found is signalled on
//     its own, through a pidfd opened and then checked against the start
//     time it was found with, so a pid reused meanwhile is never hit.
//   - Killed processes are waited for (reapWait at most), and those that
//     are the node's children (orphans) reaped with wait4 on their own pid:
//     never wait4(-1), which would take a child os/exec waits for. An
//     orphan that exits on its own is reaped by the next sweep (any child's
//     Wait, KillAll).

// reapWait bounds how long Wait and KillAll wait for killed processes to die.
const reapWait = 2 * time.Second

// adopted is set once Adopt has made this process a child subreaper.
var adopted atomic.Bool

// adoptTicks is the boot clock (in clock ticks, see bootTicks) when Adopt
// ran: an orphan that started before it is not one of a run's.
var adoptTicks atomic.Uint64

// inherited holds the processes that are no run's although they may
// become this process's children: the children it had when Adopt ran (an
// entrypoint's sidecar: `sh -c 'sidecar & exec iop-node ...'`) and their
// descendants as seen by each sweep, pid -> start time.
var inherited struct {
	mu   sync.Mutex
	pids map[int]uint64
}

var (
	selfPID  = os.Getpid()
	selfPgrp = syscall.Getpgrp()
	// mainChildren lists the children of the main thread: the orphans.
	mainChildren = "/proc/" + strconv.Itoa(selfPID) + "/task/" + strconv.Itoa(selfPID) + "/children"
	// childrenFiles reports whether the kernel has /proc/PID/task/TID/children.
	childrenFiles = sync.OnceValue(func() bool {
		_, err := os.Stat(mainChildren)
		return err == nil
	})
)

// Adopt makes this process a child subreaper (prctl
// PR_SET_CHILD_SUBREAPER): a descendant whose parent exits is reparented
// to it instead of to init, so that Wait and KillAll can find and kill
// what a child left behind however it detached, and reap it. Call it
// before starting any child, and only in a process that starts every child
// through Start from then on: Wait and KillAll reap (wait4 by pid) any
// exited child Start did not start, as an orphan. The children the process
// already has (it inherited them across exec: a container entrypoint's
// sidecar) and what they start are never killed.
func Adopt() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	// After the prctl: a child of an inherited one orphaned from now on
	// comes here, and the sweeps find it among the inherited' descendants
	// if it was there before.
	ticks := bootTicks()
	var roots []pinfo
	for _, pid := range mainThreadChildren() {
		if p, ok := readStat(pid); ok && p.ppid == selfPID {
			roots = append(roots, p)
		}
	}
	inherited.mu.Lock()
	inherited.pids = make(map[int]uint64)
	for _, p := range subtree(roots) {
		inherited.pids[p.pid] = p.start
	}
	inherited.mu.Unlock()
	adoptTicks.Store(ticks)
	adopted.Store(true)
	return nil
}

// mainThreadChildren lists the children of the main thread (of the process,
// without the children files); nil if unreadable.
func mainThreadChildren() []int {
	if childrenFiles() {
		var buf [256]byte
		b, err := readProc(mainChildren, buf[:])
		if err != nil {
			return nil
		}
		return parsePIDs(b, nil)
	}
	return scanChildren()[selfPID]
}

// isInherited reports whether p is one of the inherited processes.
func isInherited(p pinfo) bool {
	inherited.mu.Lock()
	defer inherited.mu.Unlock()
	if len(inherited.pids) == 0 {
		return false
	}
	st, ok := inherited.pids[p.pid]
	return ok && st == p.start
}

// refreshInherited drops the inherited processes that are gone and adds
// the live descendants of the rest, so that one orphaned later is known.
// Without inherited processes (the usual node) it costs nothing.
func refreshInherited() {
	inherited.mu.Lock()
	defer inherited.mu.Unlock()
	if len(inherited.pids) == 0 {
		return
	}
	var roots []pinfo
	for pid, st := range inherited.pids {
		if p, ok := readStat(pid); ok && !p.zombie && p.start == st {
			roots = append(roots, p)
		} else {
			delete(inherited.pids, pid)
		}
	}
	for _, p := range subtree(roots) {
		inherited.pids[p.pid] = p.start
	}
}

// runsOrphan reports whether p, an orphan without a run's tag or group,
// may be the leftover of a run whose leader started no later than tick
// since: it started after that, and is not in the node's own process
// group (the entrypoint's, where a run's process never goes: a group can
// be joined only from inside its session, and a run's leader starts a
// session of its own, see sysProcAttr).
func runsOrphan(p pinfo, since uint64) bool {
	return p.start >= since && p.pgrp != selfPgrp
}

func (g *Group) signal(sig syscall.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reaped {
		return // the leader may be reaped: its pid may name another process
	}
	found := g.collect(true)
	g.remember(found)
	_ = syscall.Kill(-g.pgid, sig)
	signalAll(found, map[int]bool{g.pgid: true}, sig)
}

func (g *Group) wait() error {
	// The leader exits but stays a zombie: its pid, so its group's id,
	// stays this child's while its leftovers are killed.
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, g.pgid, &info, unix.WEXITED|unix.WNOWAIT, nil)
	for err == unix.EINTR {
		err = unix.Waitid(unix.P_PID, g.pgid, &info, unix.WEXITED|unix.WNOWAIT, nil)
	}
	if err != nil {
		// Not waitable so (never seen): the leader may still be running,
		// so it is waited for first, and its group killed after.
		werr := g.cmd.Wait()
		close(g.exited)
		g.reap()
		return werr
	}
	close(g.exited)
	g.reap()
	return g.cmd.Wait()
}

// reap SIGKILLs the leader's group and every process of the child's
// found, until none is found (a process forking as it is killed may leave
// a new one) or reapWait has passed.
func (g *Group) reap() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.reaped = true
	_ = syscall.Kill(-g.pgid, syscall.SIGKILL)
	deadline := time.Now().Add(reapWait)
	for range 8 {
		found := g.collect(false)
		if len(found) == 0 {
			return
		}
		g.remember(found)
		signalAll(found, map[int]bool{g.pgid: true}, syscall.SIGKILL)
		if !awaitGone(found, deadline) {
			return
		}
	}
}

// remember adds found to the processes g has seen.
func (g *Group) remember(found []pinfo) {
	if len(found) == 0 {
		return
	}
	if g.seen == nil {
		g.seen = make(map[int]uint64, len(found))
	}
	for _, p := range found {
		g.seen[p.pid] = p.start
	}
}

// collect returns the live processes that are g's: its leader (if leader
// is set: it has not been waited for, so its pid is its own) and the
// processes seen before that are still alive, g's orphans, and the
// descendants of all these.
func (g *Group) collect(leader bool) []pinfo {
	var roots []pinfo
	if leader {
		if p, ok := readStat(g.pgid); ok && !p.zombie {
			roots = append(roots, p)
		}
	}
	for pid, start := range g.seen {
		if p, ok := readStat(pid); ok && !p.zombie && p.start == start {
			roots = append(roots, p)
		} else {
			delete(g.seen, pid)
		}
	}
	orphans, others := adoptedOrphans(g)
	since := max(g.start, adoptTicks.Load())
	for _, p := range orphans {
		// The checks from the stat already read to the environment read.
		if p.pgrp == g.pgid || others == 0 && runsOrphan(p, since) || hasTag(p.pid, g.tagged) {
			roots = append(roots, p)
		}
	}
	if len(roots) == 0 {
		return nil
	}
	return subtree(roots)
}

// hasTagPrefix reports whether pid's environment holds a tag of this
// process's children.
func hasTagPrefix(pid int) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	prefix := []byte(TagEnv + "=" + strconv.Itoa(selfPID) + ".")
	return bytes.HasPrefix(env, prefix) || bytes.Contains(env, append([]byte{0}, prefix...))
}

// hasTag reports whether pid's environment holds tagged (see Group.tagged).
func hasTag(pid int, tagged []byte) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	return bytes.HasPrefix(env, tagged[1:]) || bytes.Contains(env, tagged)
}

// adoptedOrphans returns this process's live children that Start did not
// start — after Adopt, the orphans the kernel reparented to it — less the
// inherited ones and those started before Adopt, reaping those that have
// exited, and how many live groups other than g (nil: any) there are.
// Without Adopt there are none: orphans go to init.
func adoptedOrphans(g *Group) (live []pinfo, others int) {
	if !adopted.Load() {
		return nil, 0
	}
	refreshInherited()
	// With the children files, Start forks on its own thread, so no child
	// it started, even one not yet in the registry, is a child of the main
	// thread. Without them, a fork in progress would look like an orphan:
	// Start holds spawner.mu from the fork until the child is registered.
	if !childrenFiles() {
		spawner.mu.Lock()
		defer spawner.mu.Unlock()
	}
	pids := mainThreadChildren()
	if len(pids) == 0 {
		return nil, 0
	}
	reg.mu.Lock()
	n := 0
	for _, pid := range pids {
		if _, ok := reg.live[pid]; !ok {
			pids[n] = pid
			n++
		}
	}
	pids = pids[:n]
	others = len(reg.live)
	if g != nil && reg.live[g.pgid] == g {
		others--
	}
	reg.mu.Unlock()
	for _, pid := range pids {
		p, ok := readStat(pid)
		switch {
		case !ok || p.ppid != selfPID:
		case p.zombie:
			reapChild(pid)
		case p.start < adoptTicks.Load() || isInherited(p):
		default:
			live = append(live, p)
		}
	}
	return live, others
}

// reapChild reaps pid, an exited child of this process that Start did not
// start.
func reapChild(pid int) {
	var ws syscall.WaitStatus
	for {
		if _, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil); err != syscall.EINTR {
			return
		}
	}
}

// subtree returns roots and their live descendants, each once.
func subtree(roots []pinfo) []pinfo {
	var (
		out      []pinfo
		done     = make(map[int]bool, len(roots))
		byParent map[int][]int // the /proc scan, when there are no children files
		tasks    []string
		buf      [256]byte
	)
	queue := roots
	for i := 0; i < len(queue); i++ {
		p := queue[i]
		if done[p.pid] || p.pid <= 1 || p.pid == selfPID {
			continue
		}
		done[p.pid] = true
		out = append(out, p)
		var kids []int
		if childrenFiles() {
			dir := "/proc/" + strconv.Itoa(p.pid) + "/task/"
			tasks = readDirNames(dir, tasks[:0])
			for _, tid := range tasks {
				if b, err := readProc(dir+tid+"/children", buf[:]); err == nil {
					kids = parsePIDs(b, kids)
				}
			}
		} else {
			if byParent == nil {
				byParent = scanChildren()
			}
			kids = byParent[p.pid]
		}
		for _, pid := range kids {
			if c, ok := readStat(pid); ok && c.ppid == p.pid && !c.zombie {
				queue = append(queue, c)
			}
		}
	}
	return out
}

// readDirNames appends the names in dir to names.
func readDirNames(dir string, names []string) []string {
	f, err := os.Open(dir)
	if err != nil {
		return names
	}
	defer f.Close()
	more, _ := f.Readdirnames(-1)
	return append(names, more...)
}

// parsePIDs appends the space-separated pids in b to pids.
func parsePIDs(b []byte, pids []int) []int {
	for _, f := range bytes.Fields(b) {
		if pid, err := strconv.Atoi(string(f)); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// scanChildren maps every live process's parent to it, from a full /proc
// scan.
func scanChildren() map[int][]int {
	m := map[int][]int{}
	names := readDirNames("/proc", nil)
	for _, name := range names {
		pid, err := strconv.Atoi(name)
		if err != nil {
			continue
		}
		if p, ok := readStat(pid); ok && !p.zombie {
			m[p.ppid] = append(m[p.ppid], pid)
		}
	}
	return m
}

// signalAll sends sig to the processes found: to the whole group of each
// that is in a group of its own (whose leader is one of them, or is in
// groups), and on its own to each of the rest.
func signalAll(found []pinfo, groups map[int]bool, sig syscall.Signal) {
	own := make(map[int]bool, len(found)+len(groups))
	for pg := range groups {
		own[pg] = true
	}
	for _, p := range found {
		own[p.pid] = true
	}
	sent := map[int]bool{}
	for _, p := range found {
		if pg := p.pgrp; own[pg] && pg > 1 && pg != selfPgrp {
			if !sent[pg] {
				sent[pg] = true
				_ = syscall.Kill(-pg, sig)
			}
			continue
		}
		signalOne(p, sig)
	}
}

// signalOne sends sig to p if it is still the process found: a pidfd pins
// the process, whose start time then tells it from a later one with its pid.
func signalOne(p pinfo, sig syscall.Signal) {
	fd, err := unix.PidfdOpen(p.pid, 0)
	if err != nil {
		if err == unix.ENOSYS { // before Linux 5.3
			if q, ok := readStat(p.pid); ok && q.start == p.start {
				_ = syscall.Kill(p.pid, sig)
			}
		}
		return
	}
	defer unix.Close(fd)
	if q, ok := readStat(p.pid); ok && q.start == p.start {
		_ = unix.PidfdSendSignal(fd, sig, nil, 0)
	}
}

// awaitGone waits until every process killed is gone, reaping those that
// are (or have become) this process's children, or until deadline. It
// reports whether they are all gone.
func awaitGone(killed []pinfo, deadline time.Time) bool {
	pause := time.Millisecond
	for {
		left := 0
		for _, k := range killed {
			p, ok := readStat(k.pid)
			switch {
			case !ok || p.start != k.start:
			case p.zombie && p.ppid == selfPID && adopted.Load():
				reapChild(k.pid)
			case p.zombie && !adopted.Load():
				// Its parent or init reaps it.
			default:
				left++ // alive, or a zombie its dying parent will pass on
			}
		}
		if left == 0 {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// killAll kills what groups started and every orphan that may be a run's
// (see runsOrphan), and returns what it killed for awaitKilled; KillAll has
// killed the groups themselves, and holds their locks: none has had its
// leader reaped, so each leader's pid is its own.
func killAll(groups []*Group) []pinfo {
	leaders := make(map[int]bool, len(groups))
	var roots []pinfo
	for _, g := range groups {
		leaders[g.pgid] = true
		if p, ok := readStat(g.pgid); ok && !p.zombie {
			roots = append(roots, p)
		}
	}
	orphans, _ := adoptedOrphans(nil)
	since := adoptTicks.Load()
	for _, p := range orphans {
		if leaders[p.pgrp] || runsOrphan(p, since) || hasTagPrefix(p.pid) {
			roots = append(roots, p)
		}
	}
	if len(roots) == 0 {
		return nil
	}
	found := subtree(roots)
	signalAll(found, leaders, syscall.SIGKILL)
	// The leaders are os/exec's to wait for.
	n := 0
	for _, p := range found {
		if !leaders[p.pid] {
			found[n] = p
			n++
		}
	}
	return found[:n]
}

// awaitKilled waits for the processes killAll killed to die (reapWait at
// most), reaping those that are this process's children, and then for the
// orphans that died meanwhile.
func awaitKilled(killed []pinfo) {
	if len(killed) > 0 {
		awaitGone(killed, time.Now().Add(reapWait))
	}
	adoptedOrphans(nil)
}
