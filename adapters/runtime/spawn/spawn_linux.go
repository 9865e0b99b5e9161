package spawn

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

// sysProcAttr makes the child the leader of a new session (so of a new
// process group whose id is its pid) with no controlling terminal: a node
// run in a terminal does not make its children background jobs there, which
// the terminal would stop (SIGTTIN, SIGTTOU) when they read from /dev/tty
// or change its modes, and no process of theirs can join a process group of
// the node's session (the node's own), which is joinable only from inside
// it. Pdeathsig: see spawner.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
}

// The kernel sends Pdeathsig when the thread that forked the child exits,
// not the process, and Go ends an OS thread when a goroutine locked to it
// returns. So children are forked by one goroutine locked to a thread of its
// own, which returns (ending the thread) only once no child it started is
// alive: the signal then fires exactly when the node dies. Start holds
// spawner.mu from the fork until the child is in the registry, and the
// spawner is stopped only under that lock with the registry empty.
//
// That thread is never the process's main thread: the main thread's
// children are where the kernel puts the orphans after Adopt, which
// adoptedOrphans tells from the children Start started by the thread alone
// (a child just forked is not in the registry yet); and Go never ends the
// main thread (a goroutine that returns locked to it leaves it parked for
// good).
var spawner struct {
	mu   sync.Mutex
	reqs chan spawnReq // nil when not running
}

// goSpawner runs the spawner goroutine; a test runs it on the main thread.
var goSpawner = func(loop func()) { go loop() }

type spawnReq struct {
	cmd  *exec.Cmd
	done chan spawned
}

type spawned struct {
	lo, hi uint64 // the boot clock's ticks before and after the fork
	err    error
}

func forkLoop(reqs <-chan spawnReq) {
	runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
	if syscall.Gettid() == syscall.Getpid() {
		// The main thread (see spawner): hand over to a goroutine locked
		// to another thread, which it cannot help being while this one
		// holds the main thread, and leave the main thread to the
		// scheduler once it has.
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked, as above
			close(locked)
			serveForks(reqs)
		}()
		<-locked
		runtime.UnlockOSThread()
		return
	}
	serveForks(reqs)
}

// serveForks forks each request's child, on the calling thread.
func serveForks(reqs <-chan spawnReq) {
	for r := range reqs {
		lo := bootTicks()
		err := r.cmd.Start()
		r.done <- spawned{lo: lo, hi: bootTicks(), err: err}
	}
}

// startLocked forks cmd on the spawner thread; spawner.mu is held. It
// returns the range the child's start time lies in: the kernel stamps a new
// process with the boot clock inside the fork, and /proc/PID/stat reports
// that stamp in the same ticks, so reading the clock around the fork bounds
// it without reading /proc (which cost more than the rest of the record).
func startLocked(cmd *exec.Cmd) (lo, hi uint64, err error) {
	if spawner.reqs == nil {
		spawner.reqs = make(chan spawnReq)
		reqs := spawner.reqs
		goSpawner(func() { forkLoop(reqs) })
	}
	done := make(chan spawned, 1)
	spawner.reqs <- spawnReq{cmd: cmd, done: done}
	s := <-done
	if s.lo == 0 || s.hi == 0 {
		return 0, 0, s.err // no clock: the start time is unknown
	}
	return s.lo, s.hi, s.err
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's start time: 100 on
// every architecture Go runs Linux on.
const clockTicks = 100

// bootTicks reads CLOCK_BOOTTIME, the clock the kernel stamps a process's
// start with, in clock ticks (0 if unreadable).
func bootTicks() uint64 {
	const clockBoottime = 7 // CLOCK_BOOTTIME, <linux/time.h>
	var ts syscall.Timespec
	if _, _, e := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockBoottime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0
	}
	return uint64(ts.Nano()) / (1e9 / clockTicks)
}

// stopIfIdle ends the spawner thread when no child it started is alive.
func stopIfIdle() {
	spawner.mu.Lock()
	defer spawner.mu.Unlock()
	stopIfIdleLocked()
}

func stopIfIdleLocked() {
	reg.mu.Lock()
	idle := len(reg.live) == 0
	reg.mu.Unlock()
	if idle && spawner.reqs != nil {
		close(spawner.reqs)
		spawner.reqs = nil
	}
}

// startTime returns pid's start time from /proc (0 if unreadable).
// Start does not need it (see startLocked); tests compare with it.
func startTime(pid int) uint64 {
	p, ok := readStat(pid)
	if !ok {
		return 0
	}
	return p.start
}

// pinfo is what /proc/PID/stat tells of a process.
type pinfo struct {
	pid, ppid, pgrp int
	start           uint64 // clock ticks since boot
	zombie          bool
}

// readStat reads pid's /proc/PID/stat.
func readStat(pid int) (pinfo, bool) {
	var buf [512]byte
	b, err := readProc("/proc/"+strconv.Itoa(pid)+"/stat", buf[:])
	if err != nil {
		return pinfo{}, false
	}
	// The command name may hold spaces and parentheses; fields restart after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return pinfo{}, false
	}
	// f[0] is field 3 (state); ppid is field 4, pgrp 5, starttime 22.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return pinfo{}, false
	}
	ppid, err1 := strconv.Atoi(f[1])
	pgrp, err2 := strconv.Atoi(f[2])
	start, err3 := strconv.ParseUint(f[19], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return pinfo{}, false
	}
	return pinfo{pid: pid, ppid: ppid, pgrp: pgrp, start: start, zombie: f[0] == "Z" || f[0] == "X"}, true
}

// readProc reads a whole /proc file into buf, growing it if need be, with
// no more system calls than open, the reads and close.
func readProc(path string, buf []byte) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf)+512)...)
		}
		m, err := syscall.Read(fd, buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
	}
}

// stale reports whether recorded group g still has members that an earlier
// node left behind. A pid is never reused while it names a live process
// group, so: if the leader lives, it must be the same process (its start
// time in the recorded range, a few ticks at most: no pid comes round again
// that fast); if it does not, any process still in group g is one of ours.
func stale(g *Group) bool {
	if p, ok := readStat(g.pgid); ok {
		return g.start != 0 && g.start <= p.start && p.start <= g.startMax
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readStat(pid); ok && p.pgrp == g.pgid {
			return true
		}
	}
	return false
}
