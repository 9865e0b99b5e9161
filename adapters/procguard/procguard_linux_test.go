package procguard

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// helperEnv makes the test binary act as a node: see runNode.
const helperEnv = "IOP_PROCGUARD_HELPER"

const (
	nodeToken = "tok-5f0c2a9e-never-in-a-child"
	apiKey    = "sk-0b7e41d3-never-in-a-child"
	// inheritedMarker names a file the node inherits open.
	inheritedMarker = "inherited-fd-never-in-a-child"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(runNode())
	}
	os.Exit(m.Run())
}

// runNode is what the helper process does: protect itself as iop-node's
// main does, check that it can still read the parts of its own /proc that
// the metrics and pprof use, then start a child with a clean environment,
// as the exec adapter does, that tries to read the node's environment and
// memory and prints its own environment. The child's output goes to stdout.
func runNode() int {
	if err := Protect(); err != nil {
		fmt.Println("protect:", err)
		return 3
	}
	for _, f := range []string{"stat", "status", "limits", "maps", "net/netstat"} {
		if _, err := os.ReadFile("/proc/self/" + f); err != nil {
			fmt.Println("own /proc:", err)
			return 4
		}
	}
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		fmt.Println("own /proc:", err)
		return 4
	}
	if _, err := os.Executable(); err != nil {
		fmt.Println("own /proc:", err)
		return 4
	}
	// ( … ) keeps a failed redirection from ending sh itself.
	script := `cat /proc/$PPID/environ; echo
( : < /proc/$PPID/mem ) && echo mem=opened || echo mem=refused
tr '\0' '\n' < /proc/self/environ
ls -l /proc/$$/fd`
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "CHILD_MARK=child-reads-its-own-env"}
	out, err := cmd.CombinedOutput()
	os.Stdout.Write(out)
	if err != nil {
		fmt.Println("child:", err)
		return 5
	}
	return 0
}

// A child of the node, running as the node's user, cannot read the node's
// token or provider key from /proc/$PPID/environ, nor open its memory; it
// still reads its own environment. Run as root, the node and child run as
// nobody: root may read any process's /proc whatever its dumpable flag.
func TestChildCannotReadNodeSecrets(t *testing.T) {
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		bin = copyForNobody(t, bin)
		cred = &syscall.Credential{Uid: 65534, Gid: 65534}
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{helperEnv + "=1", "PATH=/usr/bin:/bin", "IOP_NODE_TOKEN=" + nodeToken, "OPENAI_API_KEY=" + apiKey}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	// A descriptor the node inherits from whoever started it (fd 3 in the
	// node) must not reach the node's children.
	marker, err := os.Create(filepath.Join(t.TempDir(), inheritedMarker))
	if err != nil {
		t.Fatal(err)
	}
	defer marker.Close()
	cmd.ExtraFiles = []*os.File{marker}
	out, err := cmd.CombinedOutput()
	t.Logf("node output:\n%s", out)
	if err != nil {
		t.Fatalf("helper node: %v", err)
	}
	s := string(out)
	for name, secret := range map[string]string{"IOP_NODE_TOKEN": nodeToken, "OPENAI_API_KEY": apiKey} {
		if strings.Contains(s, secret) {
			t.Errorf("the child read the node's %s from /proc/$PPID/environ", name)
		}
	}
	if !strings.Contains(s, "environ: Permission denied") {
		t.Errorf("the child's read of /proc/$PPID/environ was not refused with a permission error")
	}
	if !strings.Contains(s, "mem=refused") {
		t.Errorf("the child could open /proc/$PPID/mem")
	}
	if strings.Contains(s, inheritedMarker) {
		t.Errorf("the child holds a descriptor the node inherited")
	}
	if !strings.Contains(s, "CHILD_MARK=child-reads-its-own-env") {
		t.Errorf("the child could not read its own /proc/self/environ")
	}
}

// copyForNobody copies the test binary into a directory nobody can enter:
// go test builds it in a private one.
func copyForNobody(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != filepath.Dir(d); d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o001 == 0 {
			if d != dir && d != filepath.Dir(dir) {
				t.Skipf("%s is not searchable by others: cannot run the helper as nobody (set TMPDIR)", d)
			}
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	src, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst := filepath.Join(dir, "node.test")
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(f, src); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}
