//go:build load

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// relayEnv is the environment the load tool adds to both relays' processes
// (iop-edge and iop-node, frps and frpc): GOMAXPROCS from
// IOP_LOAD_RELAY_GOMAXPROCS, so a run can show what the Go scheduler's
// threads cost each relay on a small machine (docs/benchmarks.md, "Fifteenth
// round"). Unset, the relays run with the runtime's default.
func relayEnv(t *testing.T) []string {
	g := os.Getenv("IOP_LOAD_RELAY_GOMAXPROCS")
	if g == "" {
		return nil
	}
	if n, err := strconv.Atoi(g); err != nil || n < 1 {
		t.Fatalf("IOP_LOAD_RELAY_GOMAXPROCS=%q: want a positive number", g)
	}
	return []string{"GOMAXPROCS=" + g}
}

// syscallEvents are what IOP_LOAD_SYSCALLS counts with perf stat, in the
// report's order: every system call, the ones a relay's hot path makes
// (reads and writes of its sockets; futex: waking a thread for a goroutine
// made ready on another; epoll_pwait: the network poller; nanosleep: the
// runtime's spinning and sysmon), and the scheduler switches the kernel made.
var syscallEvents = []struct{ event, name string }{
	{"raw_syscalls:sys_enter", "system calls, all"},
	{"syscalls:sys_enter_read", "read"},
	{"syscalls:sys_enter_write", "write"},
	{"syscalls:sys_enter_futex", "futex"},
	{"syscalls:sys_enter_epoll_pwait", "epoll_pwait"},
	{"syscalls:sys_enter_nanosleep", "nanosleep"},
	{"context-switches", "context switches"},
}

// relayProc is one process of a relay, for IOP_LOAD_SYSCALLS.
type relayProc struct {
	name string
	pid  int
}

// countedRelay is a relay whose processes IOP_LOAD_SYSCALLS counts: its
// name, its URL, its processes.
type countedRelay struct {
	name, url string
	procs     []relayProc
}

// syscallTable counts, with perf stat, the system calls each relay's
// processes make per request while 32 callers stream chat responses through
// it, one relay after another (frp's processes, then iop's, each counted on
// its own for the same window), and returns the report's table, or a line
// saying why there is none (no perf, or perf not allowed to trace).
func syscallTable(t *testing.T, relays []countedRelay) string {
	if _, err := exec.LookPath("perf"); err != nil {
		return "system call counts SKIPPED: no perf on PATH (apt-get install linux-perf)\n"
	}
	const window = 3 * time.Second
	type column struct {
		name   string
		counts []float64
	}
	var cols []column
	for _, r := range relays {
		perProc := make([][]float64, len(r.procs))
		errs := make([]error, len(r.procs))
		var wg sync.WaitGroup
		for i, p := range r.procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				perProc[i], errs[i] = perfCount(p.pid, window)
			}()
		}
		// perf attaches within a few ms; the load starts after that and
		// ends before perf does, so the window holds this load's requests
		// and only them (hammer fails the test on a failed request).
		time.Sleep(100 * time.Millisecond)
		_, n := hammer(t, 32, window-300*time.Millisecond, func() error { _, _, err := loadRequest(r.url, "chat"); return err })
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return fmt.Sprintf("system call counts SKIPPED: %v\n", err)
			}
		}
		if n == 0 {
			return fmt.Sprintf("system call counts SKIPPED: no request through %s completed in %s\n", r.name, window)
		}
		reqs := float64(n)
		sum := make([]float64, len(syscallEvents))
		for i, p := range r.procs {
			c := column{name: p.name}
			for j, v := range perProc[i] {
				c.counts = append(c.counts, v/reqs)
				sum[j] += v / reqs
			}
			cols = append(cols, c)
		}
		cols = append(cols, column{name: r.name, counts: sum})
	}
	var b strings.Builder
	b.WriteString("system calls per request at 32 concurrent (perf stat, 3 s per relay; 50-chunk SSE)\n\n| per request |")
	for _, c := range cols {
		fmt.Fprintf(&b, " %s |", c.name)
	}
	b.WriteString("\n|---|" + strings.Repeat("---|", len(cols)) + "\n")
	for j, ev := range syscallEvents {
		fmt.Fprintf(&b, "| %s |", ev.name)
		for _, c := range cols {
			fmt.Fprintf(&b, " %.1f |", c.counts[j])
		}
		b.WriteString("\n")
	}
	return b.String()
}

// perfCount runs perf stat on pid for d and returns the count of each of
// syscallEvents.
func perfCount(pid int, d time.Duration) ([]float64, error) {
	var events []string
	for _, e := range syscallEvents {
		events = append(events, e.event)
	}
	cmd := exec.Command("perf", "stat", "-x", ",", "-e", strings.Join(events, ","),
		"-p", strconv.Itoa(pid), "--", "sleep", strconv.FormatFloat(d.Seconds(), 'f', 3, 64))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("perf stat: %v: %s", err, strings.TrimSpace(string(out)))
	}
	counts := map[string]float64{}
	for _, line := range strings.Split(string(out), "\n") {
		// CSV: value,unit,event,...; "<not supported>" or "<not counted>"
		// as the value when perf may not trace.
		f := strings.Split(line, ",")
		if len(f) < 3 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("perf stat could not count %s (%s): run as root or lower kernel.perf_event_paranoid", f[2], f[0])
		}
		counts[f[2]] = v
	}
	var vs []float64
	for _, e := range syscallEvents {
		v, ok := counts[e.event]
		if !ok {
			return nil, fmt.Errorf("perf stat gave no count of %s: %s", e.event, strings.TrimSpace(string(out)))
		}
		vs = append(vs, v)
	}
	return vs, nil
}
