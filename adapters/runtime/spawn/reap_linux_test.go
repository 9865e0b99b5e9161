package spawn

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// inheritedDir names, in the re-run test binary, the directory the
// entrypoint shell and the re-run share.
const inheritedDir = "IOP_SPAWN_TEST_INHERITED_DIR"

// readPID reads the pid a shell wrote to path (0 if not there yet).
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// The node as a container entrypoint starts it (`sh -c 'sidecar & exec
// iop-node ...'`) has a child it did not start: the sidecar, which is no
// run's. Neither it nor what it starts (here once a run is going, orphaned
// to the node while the run goes) is killed when a run ends or the node
// stops.
func TestInheritedChildrenSurvive(t *testing.T) {
	if dir := os.Getenv(inheritedDir); dir != "" {
		inheritedNode(dir)
		return
	}
	dir := t.TempDir()
	script := `sleep 300 >/dev/null 2>&1 & echo $! > "$D/inherited"; ` +
		`(while [ ! -e "$D/go" ]; do sleep 0.01; done; sleep 300 >/dev/null 2>&1 & echo $! > "$D/later") >/dev/null 2>&1 & ` +
		`exec "$0" -test.run='^TestInheritedChildrenSurvive$' -test.count=1`
	cmd := osexec.Command("sh", "-c", script, os.Args[0])
	cmd.Env = append(os.Environ(), inheritedDir+"="+dir, "D="+dir)
	out, err := cmd.CombinedOutput()
	for _, name := range []string{"inherited", "later"} {
		if pid := readPID(filepath.Join(dir, name)); pid > 0 {
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		}
	}
	if err != nil {
		t.Fatalf("the node: %v\n%s", err, out)
	}
	for _, name := range []string{"inherited", "later"} {
		if pid := readPID(filepath.Join(dir, name)); pid == 0 || !alive(pid) {
			t.Errorf("the sidecar's %s sleep (pid %d) is gone", name, pid)
		}
	}
}

// inheritedNode is the node of TestInheritedChildrenSurvive: it adopts,
// runs a child while the sidecar's later sleep is orphaned to it, waits
// for the child and stops, exiting 1 if a sleep was killed.
func inheritedNode(dir string) {
	fail := func(f string, args ...any) {
		fmt.Fprintf(os.Stderr, f+"\n", args...)
		os.Exit(1)
	}
	if err := Adopt(); err != nil {
		fail("%v", err)
	}
	cmd := osexec.Command("sh", "-c", `touch "$D/go"; while [ ! -e "$D/end" ]; do sleep 0.01; done`)
	g, err := Start(cmd)
	if err != nil {
		fail("%v", err)
	}
	later := filepath.Join(dir, "later")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if pid := readPID(later); pid > 0 {
			if p, ok := readStat(pid); ok && p.ppid == selfPID {
				break
			}
		}
		if time.Now().After(deadline) {
			fail("the sidecar's later sleep never became the node's")
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "end"), nil, 0o600); err != nil {
		fail("%v", err)
	}
	if err := g.Wait(); err != nil {
		fail("the run: %v", err)
	}
	g.Release()
	check := func(when string) {
		for _, name := range []string{"inherited", "later"} {
			if pid := readPID(filepath.Join(dir, name)); !alive(pid) {
				fail("%s: the sidecar's %s sleep (pid %d) was killed", when, name, pid)
			}
		}
	}
	check("after the run")
	KillAll()
	check("after KillAll")
	os.Exit(0)
}
