package exec_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"go.uber.org/goleak"

	"iop/adapters/runtime/exec"
	"iop/adapters/runtime/runtimetest"
	"iop/adapters/runtime/spawn"
	"iop/domain"
)

func TestMain(m *testing.M) {
	// As iop-node does: orphans of the commands come to this process. Every
	// child these tests start goes through spawn.Start.
	if err := spawn.Adopt(); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// deadline bounds every test: generous, so only a hang trips it.
const deadline = 20 * time.Second

func newAdapter(t *testing.T, targets map[string]domain.ExecTarget) *exec.Adapter {
	t.Helper()
	a, err := exec.New(domain.AdapterConfig{Name: "local", Type: domain.AdapterExec, Targets: targets})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func shell(script string) domain.ExecTarget {
	return domain.ExecTarget{Command: []string{"sh", "-c", script}}
}

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// execute runs target with input and returns the recorded events and the
// error Execute returned.
func execute(t *testing.T, a *exec.Adapter, target, input string) (*runtimetest.Sink, error) {
	t.Helper()
	sink := &runtimetest.Sink{}
	err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "local", Target: target, Input: []byte(input)}, sink)
	return sink, err
}

// pidOf returns the pid announced by the run's metadata event.
func pidOf(t *testing.T, events []domain.RunEvent) int {
	t.Helper()
	for _, ev := range events {
		if ev.Type == domain.EventMetadata {
			var m struct{ PID int }
			if err := json.Unmarshal(ev.Metadata, &m); err != nil || m.PID <= 0 {
				t.Fatalf("metadata %s: want {\"pid\":N} (%v)", ev.Metadata, err)
			}
			return m.PID
		}
	}
	t.Fatalf("no metadata event in %v", events)
	return 0
}

// requireGroupGone waits until no process of group pgid is running.
func requireGroupGone(t *testing.T, pgid int) {
	t.Helper()
	if !runtimetest.GroupGone(pgid, 5*time.Second) {
		t.Fatalf("process group %d is still running", pgid)
	}
}

func requireTerminal(t *testing.T, sink *runtimetest.Sink, typ domain.EventType, code string) domain.RunEvent {
	t.Helper()
	events := sink.Events()
	if len(events) == 0 {
		t.Fatal("no events")
	}
	last := events[len(events)-1]
	if last.Type != typ {
		t.Fatalf("last event = %+v, want %s (events %v)", last, typ, sink.Types())
	}
	if code != "" && (last.Error == nil || last.Error.Code != code) {
		t.Fatalf("last event error = %+v, want code %s", last.Error, code)
	}
	for _, ev := range events[:len(events)-1] {
		if ev.Type.Terminal() || ev.Type == domain.EventStart {
			t.Fatalf("unexpected %s event before the end: %v", ev.Type, sink.Types())
		}
	}
	return last
}

func TestNewRejectsEmptyCommand(t *testing.T) {
	for _, cmd := range [][]string{nil, {}, {""}} {
		_, err := exec.New(domain.AdapterConfig{Name: "local", Targets: map[string]domain.ExecTarget{"t": {Command: cmd}}})
		if !errors.Is(err, domain.ErrConfig) {
			t.Errorf("New with command %q: err = %v, want config_error", cmd, err)
		}
	}
}

func TestCapabilities(t *testing.T) {
	a := newAdapter(t, nil)
	if got := a.Capabilities(); got.MaxConcurrency != domain.DefaultMaxConcurrency || got.Sessions {
		t.Errorf("default capabilities = %+v", got)
	}
	a, err := exec.New(domain.AdapterConfig{Name: "local", MaxConcurrency: 7})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Capabilities().MaxConcurrency; got != 7 {
		t.Errorf("MaxConcurrency = %d, want 7", got)
	}
}

func TestStdinToStdout(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"upper": {Command: []string{"tr", "a-z", "A-Z"}}})
	sink, err := execute(t, a, "upper", "hello, world\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := sink.Text(); got != "HELLO, WORLD\n" {
		t.Errorf("text = %q", got)
	}
	if types := sink.Types(); types[0] != domain.EventMetadata {
		t.Errorf("first event = %s, want metadata", types[0])
	}
	pidOf(t, sink.Events())
	done := requireTerminal(t, sink, domain.EventComplete, "")
	if done.Usage == nil || done.Usage.DurationMS < 0 {
		t.Errorf("complete usage = %+v", done.Usage)
	}
}

func TestLargeOutputComesInBoundedChunks(t *testing.T) {
	input := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	a := newAdapter(t, map[string]domain.ExecTarget{"cat": {Command: []string{"cat"}}})
	sink, err := execute(t, a, "cat", input)
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if sink.Text() != input {
		t.Fatalf("output differs from input (%d bytes, want %d)", len(sink.Text()), len(input))
	}
	for _, ev := range sink.Events() {
		if len(ev.Text) > 32<<10 {
			t.Fatalf("delta of %d bytes exceeds 32 KiB", len(ev.Text))
		}
	}
}

func TestNoShell(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"p": {Command: []string{"printf", "%s|%s", "$HOME", "a; echo hi"}}})
	sink, err := execute(t, a, "p", "")
	if err != nil {
		t.Fatal(err)
	}
	if got := sink.Text(); got != "$HOME|a; echo hi" {
		t.Errorf("text = %q, want the arguments verbatim", got)
	}
}

func TestDirAndEnv(t *testing.T) {
	dir := t.TempDir()
	a := newAdapter(t, map[string]domain.ExecTarget{"env": {
		Command: []string{"sh", "-c", `printf '%s\n' "$IOP_TEST_VAR"; pwd -P`},
		Dir:     dir,
		Env:     map[string]string{"IOP_TEST_VAR": "from target"},
	}})
	sink, err := execute(t, a, "env", "")
	if err != nil {
		t.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sink.Text(), "from target\n"+real+"\n"; got != want {
		t.Errorf("text = %q, want %q", got, want)
	}
}

// The first delta must arrive while the command is still running: the
// command does not exit until the test, having seen that delta, creates the
// gate file.
func TestStdoutIsStreamed(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	a := newAdapter(t, map[string]domain.ExecTarget{"stream": {
		Command: []string{"sh", "-c", `printf a; while [ ! -e "$GATE" ]; do sleep 0.01; done; printf b`},
		Env:     map[string]string{"GATE": gate},
	}})
	ctx := testContext(t)
	sink := &runtimetest.Sink{}
	exited := make(chan error, 1)
	go func() {
		exited <- a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "local", Target: "stream"}, sink)
	}()

	if err := sink.WaitFor(ctx, hasDelta); err != nil {
		t.Fatalf("no delta before the command exited: %v", err)
	}
	select {
	case err := <-exited:
		t.Fatalf("Execute returned (%v) before the gate opened", err)
	default:
	}
	if got := sink.Text(); got != "a" {
		t.Errorf("first output = %q, want %q", got, "a")
	}

	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if got := sink.Text(); got != "ab" {
		t.Errorf("text = %q, want %q", got, "ab")
	}
}

func TestUTF8SplitAcrossReads(t *testing.T) {
	// € is \342\202\254 and 😀 is \360\237\230\200; the sleeps make the
	// adapter read each rune in two pieces.
	a := newAdapter(t, map[string]domain.ExecTarget{"utf8": shell(
		`printf '\342\202'; sleep 0.2; printf '\254 \360\237'; sleep 0.2; printf '\230\200'`)})
	sink, err := execute(t, a, "utf8", "")
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	for _, ev := range sink.Events() {
		if ev.Type == domain.EventDelta && (!utf8.ValidString(ev.Text) || strings.ContainsRune(ev.Text, utf8.RuneError)) {
			t.Errorf("delta %q splits a rune", ev.Text)
		}
	}
	if got := sink.Text(); got != "€ 😀" {
		t.Errorf("text = %q, want %q", got, "€ 😀")
	}
}

func TestNonZeroExit(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"fail": shell(`printf partial; echo '  boom  ' >&2; exit 3`)})
	sink, err := execute(t, a, "fail", "")
	if err != nil {
		t.Fatal(err)
	}
	last := requireTerminal(t, sink, domain.EventError, domain.CodeRunFailed)
	if last.Error.Message != "exit status 3: boom" {
		t.Errorf("message = %q", last.Error.Message)
	}
	if got := sink.Text(); got != "partial" {
		t.Errorf("text = %q", got)
	}
}

func TestNonZeroExitKeepsStderrTail(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"fail": shell(
		`i=0; while [ $i -lt 1000 ]; do printf 'xxxxxxxxxx' >&2; i=$((i+1)); done; printf END >&2; exit 1`)})
	sink, err := execute(t, a, "fail", "")
	if err != nil {
		t.Fatal(err)
	}
	msg := requireTerminal(t, sink, domain.EventError, domain.CodeRunFailed).Error.Message
	const prefix = "exit status 1: "
	if !strings.HasPrefix(msg, prefix) || !strings.HasSuffix(msg, "xxxEND") {
		t.Errorf("message = %.40q…%q", msg, msg[max(0, len(msg)-20):])
	}
	if len(msg) != len(prefix)+4096 {
		t.Errorf("message has %d bytes, want %d", len(msg), len(prefix)+4096)
	}
}

func TestUnknownTarget(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"b": shell("true"), "a": shell("true")})
	sink, err := execute(t, a, "nope", "")
	if !errors.Is(err, domain.ErrTargetNotFound) {
		t.Fatalf("err = %v, want target_not_found", err)
	}
	if !strings.Contains(err.Error(), "known: a, b") {
		t.Errorf("err = %q, want the known targets listed", err)
	}
	if n := len(sink.Events()); n != 0 {
		t.Errorf("%d events emitted", n)
	}
}

// A target whose dir is missing, or a file, says so: the child's failed
// chdir used to be reported as the program not existing.
func TestWorkDirProblemsAreNamed(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{
		"/nonexistent/iop-dir": "work dir: stat /nonexistent/iop-dir: no such file or directory",
		file:                   "work dir " + file + " is not a directory",
	} {
		a := newAdapter(t, map[string]domain.ExecTarget{"x": {Command: []string{"true"}, Dir: dir}})
		_, err := execute(t, a, "x", "")
		if msg := domain.MessageOf(err); domain.CodeOf(err) != domain.CodeRunFailed || !strings.Contains(msg, want) || strings.Contains(msg, "bin/true") {
			t.Errorf("dir %s: %v, want run_failed saying %q", dir, err, want)
		}
	}
}

// A stderr tail that is not UTF-8 (a Latin-1 message) keeps a U+FFFD for
// each such byte, as the output does, instead of losing letters.
func TestStderrTailKeepsItsLetters(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"x": {Command: []string{"sh", "-c", `printf 'caf\351 cr\350me' >&2; exit 1`}}})
	sink, err := execute(t, a, "x", "")
	if err != nil {
		t.Fatal(err)
	}
	ev, ok := sink.Terminal()
	if !ok || ev.Error == nil || !strings.HasSuffix(ev.Error.Message, "caf\uFFFD cr\uFFFDme") {
		t.Fatalf("terminal %+v, want the stderr with U+FFFD for the Latin-1 letters", ev)
	}
}

func TestBinaryNotFound(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"missing": {Command: []string{"iop-no-such-binary-here"}}})
	sink, err := execute(t, a, "missing", "")
	if domain.CodeOf(err) != domain.CodeRunFailed {
		t.Fatalf("err = %v, want run_failed", err)
	}
	if msg := domain.MessageOf(err); !strings.Contains(msg, "iop-no-such-binary-here") || !strings.Contains(msg, "not found") {
		t.Errorf("message = %q", msg)
	}
	if n := len(sink.Events()); n != 0 {
		t.Errorf("%d events emitted", n)
	}
}

func TestTimeoutKillsProcessGroup(t *testing.T) {
	target := shell("sleep 30 & wait")
	target.Timeout = 300 * time.Millisecond
	a := newAdapter(t, map[string]domain.ExecTarget{"slow": target})
	start := time.Now()
	sink, err := execute(t, a, "slow", "")
	if err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("timeout took %s", elapsed)
	}
	last := requireTerminal(t, sink, domain.EventError, domain.CodeTimeout)
	if !strings.Contains(last.Error.Message, "300ms") {
		t.Errorf("message = %q", last.Error.Message)
	}
	requireGroupGone(t, pidOf(t, sink.Events()))
}

func TestAdapterTimeoutApplies(t *testing.T) {
	a, err := exec.New(domain.AdapterConfig{Name: "local", Timeout: 200 * time.Millisecond,
		Targets: map[string]domain.ExecTarget{"slow": {Command: []string{"sleep", "30"}}}})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := execute(t, a, "slow", "")
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventError, domain.CodeTimeout)
	requireGroupGone(t, pidOf(t, sink.Events()))
}

// cancelled is the outcome of cancelRun.
type cancelled struct {
	sink *runtimetest.Sink
	err  error         // what Execute returned
	pid  int           // the command's pid, also its process group id
	took time.Duration // from the cancel until Execute returned
}

// cancelRun starts target, waits for its first output, then cancels the run.
func cancelRun(t *testing.T, a *exec.Adapter, target string) cancelled {
	t.Helper()
	ctx, cancel := context.WithCancel(testContext(t))
	defer cancel()
	sink := &runtimetest.Sink{}
	exited := make(chan error, 1)
	go func() {
		exited <- a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "local", Target: target}, sink)
	}()
	if err := sink.WaitFor(testContext(t), hasDelta); err != nil {
		t.Fatalf("command never printed: %v", err)
	}
	pid := pidOf(t, sink.Events())
	cancel()
	start := time.Now()
	select {
	case err := <-exited:
		return cancelled{sink: sink, err: err, pid: pid, took: time.Since(start)}
	case <-time.After(deadline):
		t.Fatal("Execute did not return after cancel")
		return cancelled{}
	}
}

func hasDelta(events []domain.RunEvent) bool {
	for _, ev := range events {
		if ev.Type == domain.EventDelta {
			return true
		}
	}
	return false
}

func TestCancelKillsProcessGroup(t *testing.T) {
	// The grandchild sleep is in the same process group; "ready" is printed
	// once it has been started.
	a := newAdapter(t, map[string]domain.ExecTarget{"slow": shell("sleep 30 & echo ready; wait")})
	got := cancelRun(t, a, "slow")
	if !errors.Is(got.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", got.err)
	}
	if got.took > 5*time.Second {
		t.Errorf("Execute took %s to return after cancel", got.took)
	}
	if _, ok := got.sink.Terminal(); ok {
		t.Errorf("terminal event emitted on cancel: %v", got.sink.Types())
	}
	requireGroupGone(t, got.pid)
}

func TestCancelEscalatesToSIGKILL(t *testing.T) {
	// trap "" TERM makes the shell and its children ignore SIGTERM.
	a := newAdapter(t, map[string]domain.ExecTarget{"stubborn": shell(`trap "" TERM; sleep 30 & echo ready; wait`)})
	a.KillGrace = 200 * time.Millisecond
	got := cancelRun(t, a, "stubborn")
	if !errors.Is(got.err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", got.err)
	}
	if got.took < a.KillGrace || got.took > 5*time.Second {
		t.Errorf("Execute returned %s after cancel, want between the grace (%s) and 5s", got.took, a.KillGrace)
	}
	if _, ok := got.sink.Terminal(); ok {
		t.Errorf("terminal event emitted on cancel: %v", got.sink.Types())
	}
	requireGroupGone(t, got.pid)
}

func TestAlreadyCancelledContextStartsNothing(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"t": shell("true")})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sink := &runtimetest.Sink{}
	if err := a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "local", Target: "t"}, sink); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if n := len(sink.Events()); n != 0 {
		t.Errorf("%d events emitted", n)
	}
}

func TestSinkErrorStopsProcess(t *testing.T) {
	errGone := errors.New("stream gone")
	a := newAdapter(t, map[string]domain.ExecTarget{"chatty": shell("sleep 30 & echo ready; wait")})
	sink := &runtimetest.Sink{Err: errGone, FailAfter: 1} // the metadata event gets through
	start := time.Now()
	err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "local", Target: "chatty"}, sink)
	if !errors.Is(err, errGone) {
		t.Fatalf("err = %v, want the sink's error", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Execute took %s", took)
	}
	if types := sink.Types(); len(types) != 1 || types[0] != domain.EventMetadata {
		t.Errorf("events = %v, want just metadata", types)
	}
	requireGroupGone(t, pidOf(t, sink.Events()))
}

func TestSinkErrorOnFirstEvent(t *testing.T) {
	errGone := errors.New("stream gone")
	a := newAdapter(t, map[string]domain.ExecTarget{"slow": shell("sleep 30 & wait")})
	start := time.Now()
	err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "local", Target: "slow"}, &runtimetest.Sink{Err: errGone})
	if !errors.Is(err, errGone) {
		t.Fatalf("err = %v, want the sink's error", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Execute took %s", took)
	}
}

// A slow receiver holds the command back instead of losing output.
func TestBackPressure(t *testing.T) {
	input := strings.Repeat("x", 1<<20)
	a := newAdapter(t, map[string]domain.ExecTarget{"cat": {Command: []string{"cat"}}})
	block := make(chan struct{})
	sink := &runtimetest.Sink{Block: block}
	exited := make(chan error, 1)
	go func() {
		exited <- a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "local", Target: "cat", Input: []byte(input)}, sink)
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-exited:
		t.Fatalf("Execute returned (%v) while the sink was blocked", err)
	default:
	}
	close(block)
	if err := <-exited; err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if sink.Text() != input {
		t.Errorf("output lost under back-pressure: %d bytes, want %d", len(sink.Text()), len(input))
	}
}

// A background descendant holding stdout open cannot hold the run open, and
// is killed once the command exits.
func TestExitWithBackgroundDescendant(t *testing.T) {
	a := newAdapter(t, map[string]domain.ExecTarget{"bg": shell("sleep 30 & echo done")})
	start := time.Now()
	sink, err := execute(t, a, "bg", "")
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Execute took %s", took)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if got := sink.Text(); got != "done\n" {
		t.Errorf("text = %q", got)
	}
	requireGroupGone(t, pidOf(t, sink.Events()))
}

// A target's child sees a clean environment: the node's token and provider
// keys stay out unless inherit_env names them; declared env reaches it, a
// target's value winning over the adapter's.
func TestCleanEnvironment(t *testing.T) {
	t.Setenv("IOP_NODE_TOKEN", "node-secret-token")
	t.Setenv("OPENAI_API_KEY", "sk-provider-secret")
	t.Setenv("IOP_WANTED_SECRET", "wanted")
	t.Setenv("LC_TIME", "C")
	a, err := exec.New(domain.AdapterConfig{
		Name: "local", Type: domain.AdapterExec,
		Env:        map[string]string{"FROM_ADAPTER": "a", "SHARED": "adapter"},
		InheritEnv: []string{"IOP_WANTED_SECRET"},
		Targets: map[string]domain.ExecTarget{
			"env":   {Command: []string{"env"}, Env: map[string]string{"SHARED": "target"}},
			"token": {Command: []string{"env"}, InheritEnv: []string{"IOP_NODE_TOKEN"}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := execute(t, a, "env", "")
	if err != nil {
		t.Fatal(err)
	}
	got := sink.Text()
	for _, secret := range []string{"node-secret-token", "sk-provider-secret", "IOP_NODE_TOKEN", "OPENAI_API_KEY"} {
		if strings.Contains(got, secret) {
			t.Fatalf("child environment holds %q:\n%s", secret, got)
		}
	}
	for _, want := range []string{"FROM_ADAPTER=a\n", "SHARED=target\n", "IOP_WANTED_SECRET=wanted\n", "LC_TIME=C\n", "PATH="} {
		if !strings.Contains(got, want) {
			t.Fatalf("child environment lacks %q:\n%s", want, got)
		}
	}
	sink, err = execute(t, a, "token", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sink.Text(), "IOP_NODE_TOKEN=node-secret-token\n") {
		t.Fatalf("a target naming IOP_NODE_TOKEN in inherit_env must get it:\n%s", sink.Text())
	}
}

// Output the command left in the pipe when it exited is all delivered,
// however long the receiver holds the run back after the exit: nothing
// closes the pipe on a timer while output waits in it.
func TestSlowReceiverGetsOutputLeftAfterExit(t *testing.T) {
	const size = 50000 // fits the pipe: the command exits at once
	a := newAdapter(t, map[string]domain.ExecTarget{"burst": shell(fmt.Sprintf("head -c %d /dev/zero | tr '\\0' x", size))})
	block := make(chan struct{})
	time.AfterFunc(2*time.Second, func() { close(block) }) // longer than pipeGrace
	sink := &runtimetest.Sink{Block: block}
	if err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "local", Target: "burst"}, sink); err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if got := len(sink.Text()); got != size {
		t.Fatalf("delivered %d bytes of %d", got, size)
	}
}

// A descendant that left the command's process group and keeps stdout open
// does not hold the run open once the command has exited.
func TestExitWithDetachedDescendantHoldingStdout(t *testing.T) {
	if _, err := osexec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	a := newAdapter(t, map[string]domain.ExecTarget{"bg": shell("setsid sleep 5 & echo done")})
	sink, err := execute(t, a, "bg", "")
	if err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
	if got := sink.Text(); got != "done\n" {
		t.Errorf("text = %q", got)
	}
}

// A detached descendant that keeps writing to stdout does not hold the run
// (and its slot) open once the command has exited.
func TestExitWithTricklingDetachedDescendant(t *testing.T) {
	if _, err := osexec.LookPath("setsid"); err != nil {
		t.Skip("no setsid")
	}
	pidfile := filepath.Join(t.TempDir(), "pid")
	t.Cleanup(func() {
		b, _ := os.ReadFile(pidfile)
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	a := newAdapter(t, map[string]domain.ExecTarget{"bg": shell(`setsid sh -c 'echo $$ > ` + pidfile + `; while :; do echo tick; sleep 0.2; done' & echo done`)})
	ctx, cancel := context.WithTimeout(testContext(t), 10*time.Second)
	defer cancel()
	sink := &runtimetest.Sink{}
	if err := a.Execute(ctx, domain.RunRequest{RunID: "r1", Adapter: "local", Target: "bg"}, sink); err != nil {
		t.Fatalf("Execute = %v: the run was held open by a detached descendant", err)
	}
	requireTerminal(t, sink, domain.EventComplete, "")
}

// exitedSink holds the run's metadata event back until the command it names
// has exited (a link slow to take the first event), so that the command's
// timeout starts only after that.
type exitedSink struct {
	runtimetest.Sink
	t *testing.T
}

func (s *exitedSink) Emit(ev domain.RunEvent) error {
	if ev.Type == domain.EventMetadata {
		var m struct{ PID int }
		if err := json.Unmarshal(ev.Metadata, &m); err != nil || m.PID <= 0 {
			s.t.Errorf("metadata %s: want {\"pid\":N} (%v)", ev.Metadata, err)
		} else if p, ok := runtimetest.ProcOf(m.PID); ok {
			for end := time.Now().Add(deadline); p.Alive() && time.Now().Before(end); {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	return s.Sink.Emit(ev)
}

// A command that exits before its timeout expires is not reported as timed
// out while what it left behind is dealt with. Here it leaves a process that
// emptied its environment in a session of its own, holding stderr: with
// another run going on, the run's end cannot tell that process from the other
// run's (spawn.Group.Wait) and waits up to a second (pipeGrace) for stderr,
// and the timeout expired meanwhile. The run ended in "timed out after
// 100ms" for a command that had exited 0 in a few milliseconds.
func TestExitBeforeTimeoutIsNoTimeout(t *testing.T) {
	setsid, err1 := osexec.LookPath("setsid")
	sleep, err2 := osexec.LookPath("sleep")
	if err1 != nil || err2 != nil {
		t.Skip("no setsid or sleep")
	}
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pid")
	t.Cleanup(func() {
		b, _ := os.ReadFile(pidfile)
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	quick := shell("env -i " + setsid + " /bin/sh -c 'echo $$ > " + pidfile + ".tmp; mv " + pidfile + ".tmp " + pidfile + "; exec " + sleep + " 30' >/dev/null & " +
		"while [ ! -s " + pidfile + " ]; do sleep 0.01; done; echo exited")
	quick.Timeout = 100 * time.Millisecond
	a := newAdapter(t, map[string]domain.ExecTarget{"quick": quick, "other": {Command: []string{"sleep", "30"}}})

	ctx, cancel := context.WithCancel(testContext(t))
	other := &runtimetest.Sink{}
	otherDone := make(chan error, 1)
	go func() {
		otherDone <- a.Execute(ctx, domain.RunRequest{RunID: "r0", Adapter: "local", Target: "other"}, other)
	}()
	defer func() {
		cancel()
		<-otherDone
	}()
	if err := other.WaitFor(ctx, func(evs []domain.RunEvent) bool { return len(evs) > 0 }); err != nil {
		t.Fatal(err)
	}

	sink := &exitedSink{t: t}
	if err := a.Execute(testContext(t), domain.RunRequest{RunID: "r1", Adapter: "local", Target: "quick"}, sink); err != nil {
		t.Fatal(err)
	}
	requireTerminal(t, &sink.Sink, domain.EventComplete, "")
	if got := sink.Text(); got != "exited\n" {
		t.Errorf("text = %q", got)
	}
}
