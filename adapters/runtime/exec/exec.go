// Package exec is the runtime adapter that runs a local command per run.
//
// Each configured target is an argv, run directly with no shell in between:
// arguments reach the program exactly as configured, and nothing in a run's
// input is ever interpreted as shell syntax. A command named without a
// slash is looked up in the PATH the command gets — the one the target's
// or adapter's env declares, else the node's — on its first run; later
// runs reuse that file while it is still an executable, and search PATH
// again once it is not (a program installed later earlier in PATH is not
// picked up until then, or until the node restarts). The command runs in the
// target's directory (else the adapter's work_dir, else the node's), with a
// clean environment (proc.Environ: PATH, HOME, USER, LANG, LC_*, TZ, TMPDIR,
// the adapter's and target's env, and the variables their inherit_env name —
// never the node token or a provider key unless named — plus spawn.TagEnv),
// and in a session and process group of its own, without a controlling
// terminal (spawn.Start), so that everything it spawns can be signalled
// together (and what leaves the group found: spawn.Group).
//
// The run input is written to the command's stdin, which is then closed.
// Stdout is streamed: every read (of at most 32 KiB) becomes a delta event
// as soon as it is read, without waiting for newlines, except that a UTF-8
// sequence is never split across two events (an incomplete trailing rune is
// held back until the next read). Bytes that are not UTF-8 at all are sent
// as U+FFFD. Stderr is not streamed; its last 4 KiB are kept for the error
// message.
//
// Events: right after the process starts, one metadata event carrying
// {"pid":N} (N is also the process group id); then the deltas; then exactly
// one terminal event — complete on exit status 0, error with code run_failed
// and message "exit status N: <stderr tail>" otherwise ("signal: killed"
// and the like for a command a signal ended), or error with code timeout
// when the target's timeout (else the adapter's; zero means none) expires
// before the command has exited, in which case the process group is killed
// (a command that exited in time is judged by its exit status, however long
// what it left then takes to go). The adapter never emits start: the run
// manager does.
//
// Cancelling ctx sends SIGTERM to the whole process group (and to what the
// command started in groups or sessions of their own: spawn.Group.Signal)
// and SIGKILL after KillGrace; Execute waits for the process and returns
// ctx.Err() without a terminal event (the run manager emits cancelled).
// When the sink's Emit fails, the process group is killed and Execute
// returns that error. Once the command has exited, for whatever reason,
// anything it left running is killed too, in its process group or not
// (spawn.Group.Wait), before Execute returns, and a descendant still
// holding stdout or stderr open cannot delay the end of the run by more
// than a second for each (stderr's wait, then stdout's).
package exec

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"iop/adapters/runtime/internal/proc"
	"maps"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"iop/adapters/runtime/spawn"
	"iop/domain"
	"iop/ports"
)

// DefaultKillGrace is how long a cancelled run's process group has between
// SIGTERM and SIGKILL unless Adapter.KillGrace says otherwise.
const DefaultKillGrace = 2 * time.Second

// pipeGrace is cmd.WaitDelay: how long Wait keeps reading stderr after the
// command has exited, in case a descendant outside its group still holds it
// open. (Stdout has the same bound on waiting for new bytes: proc.Output.)
const pipeGrace = time.Second

// Adapter runs the targets of one exec adapter instance. It is safe for
// concurrent use.
type Adapter struct {
	// KillGrace is the delay between SIGTERM and SIGKILL when a run is
	// cancelled; zero or negative sends SIGKILL at once. New sets it to
	// DefaultKillGrace; change it only before the first Execute.
	KillGrace time.Duration

	name           string
	targets        map[string]domain.ExecTarget
	maxConcurrency int
	timeout        time.Duration
	workDir        string

	// found maps a command named without a slash to the absolute path PATH
	// resolved it to, so a run stats one file instead of searching every
	// PATH directory (that search was about 5% of a node's CPU per run).
	// Keys are configured commands only.
	found sync.Map
}

var _ ports.RuntimeAdapter = (*Adapter)(nil)

// New builds an exec adapter from its config. Every target must have a
// command; errors are domain.ErrConfig.
func New(cfg domain.AdapterConfig) (*Adapter, error) {
	if cfg.MaxConcurrency < 0 {
		return nil, domain.Errorf(domain.CodeConfigError, "exec adapter %q: max_concurrency must not be negative", cfg.Name)
	}
	if cfg.Timeout < 0 {
		return nil, domain.Errorf(domain.CodeConfigError, "exec adapter %q: timeout must not be negative", cfg.Name)
	}
	targets := make(map[string]domain.ExecTarget, len(cfg.Targets))
	for name, t := range cfg.Targets {
		if len(t.Command) == 0 || t.Command[0] == "" {
			return nil, domain.Errorf(domain.CodeConfigError, "exec adapter %q: target %q has an empty command", cfg.Name, name)
		}
		if t.Timeout < 0 {
			return nil, domain.Errorf(domain.CodeConfigError, "exec adapter %q: target %q: timeout must not be negative", cfg.Name, name)
		}
		t.Command = slices.Clone(t.Command)
		// The adapter's env and inherit_env apply to every target; a
		// target's own env wins over the adapter's for the same name.
		env := maps.Clone(cfg.Env)
		if env == nil {
			env = map[string]string{}
		}
		maps.Copy(env, t.Env)
		t.Env = env
		t.InheritEnv = append(slices.Clone(cfg.InheritEnv), t.InheritEnv...)
		targets[name] = t
	}
	return &Adapter{
		KillGrace:      DefaultKillGrace,
		name:           cfg.Name,
		targets:        targets,
		maxConcurrency: cmp.Or(cfg.MaxConcurrency, domain.DefaultMaxConcurrency),
		timeout:        cfg.Timeout,
		workDir:        cfg.WorkDir,
	}, nil
}

// Capabilities reports the configured concurrency; exec keeps no sessions.
func (a *Adapter) Capabilities() domain.Capabilities {
	return domain.Capabilities{MaxConcurrency: a.maxConcurrency}
}

// Admit refuses a run for a target this adapter does not have, before the
// node acknowledges the run.
func (a *Adapter) Admit(req domain.RunRequest) error {
	_, err := a.target(req.Target)
	return err
}

// target returns the named target or a target_not_found error listing them.
func (a *Adapter) target(name string) (domain.ExecTarget, error) {
	t, ok := a.targets[name]
	if ok {
		return t, nil
	}
	known := strings.Join(slices.Sorted(maps.Keys(a.targets)), ", ")
	if name == "" {
		return t, domain.Errorf(domain.CodeTargetNotFound, "exec adapter %q needs a target (known: %s)", a.name, known)
	}
	return t, domain.Errorf(domain.CodeTargetNotFound, "exec adapter %q has no target %q (known: %s)", a.name, name, known)
}

// Execute runs req.Target with req.Input on stdin, as the package doc
// describes. It returns an error wrapping domain.ErrTargetNotFound for an
// unknown target and a run_failed error when the command cannot start, both
// without emitting anything; ctx.Err() when cancelled; the sink's error when
// Emit fails; and nil once it has emitted the terminal event.
func (a *Adapter) Execute(ctx context.Context, req domain.RunRequest, sink ports.EventSink) error {
	t, err := a.target(req.Target)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	stdout := newDeltaWriter(sink)
	stderr := newTailBuffer(stderrTailSize)
	cmd := a.command(t.Command, t.Env)
	cmd.Dir = cmp.Or(t.Dir, a.workDir)
	cmd.Env = proc.Environ(t.Env, t.InheritEnv)
	stdin, err := prefilledStdin(req.Input)
	if err != nil {
		return domain.Errorf(domain.CodeRunFailed, "start target %q: stdin: %v", req.Target, err)
	}
	if stdin != nil {
		cmd.Stdin = stdin
	} else {
		cmd.Stdin = bytes.NewReader(req.Input)
	}
	out, w, err := proc.NewOutput()
	if err != nil {
		if stdin != nil {
			_ = stdin.Close()
		}
		return domain.Errorf(domain.CodeRunFailed, "start target %q: stdout: %v", req.Target, err)
	}
	// The command writes stdout straight into a pipe this run reads at the
	// sink's pace (see proc.Output); WaitDelay bounds only the stderr
	// copy, which never blocks.
	cmd.Stdout = w
	cmd.Stderr = stderr
	cmd.WaitDelay = pipeGrace

	started := time.Now()
	group, err := spawn.Start(cmd)
	_ = w.Close() // the child has its copy, or never will
	if stdin != nil {
		_ = stdin.Close() // the child has its copy, or never will
	}
	if err != nil {
		_ = out.Close()
		return domain.Errorf(domain.CodeRunFailed, "start target %q: %v", req.Target, err)
	}
	// Every way out below waits for the command, which kills whatever it
	// left running (spawn.Group.Wait).
	defer group.Release()
	p := &process{group: group, done: make(chan struct{})}
	go func() {
		p.waitErr = group.Wait()
		close(p.done)
	}()
	// The stdout copy is this run's: every way out closes the pipe and
	// waits for the copy, so no delta follows the run's end.
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		stdout.copyFrom(out)
	}()
	defer func() {
		_ = out.Close()
		<-copied
	}()

	meta := append(strconv.AppendInt([]byte(`{"pid":`), int64(p.group.PGID()), 10), '}')
	if err := sink.Emit(domain.RunEvent{Type: domain.EventMetadata, Metadata: meta}); err != nil {
		stdout.release(false)
		p.kill()
		return err
	}
	stdout.release(true)

	var expired <-chan time.Time
	timeout := cmp.Or(t.Timeout, a.timeout)
	if timeout > 0 {
		timer := time.NewTimer(timeout)
		defer timer.Stop()
		expired = timer.C
	}

	timedOut := false
wait:
	for {
		select {
		case <-p.done:
			break wait
		case <-ctx.Done():
			p.terminate(a.KillGrace)
			return ctx.Err()
		case <-stdout.failed:
			p.kill()
			return stdout.err
		case <-expired:
			select {
			case <-p.group.Exited():
				// The command exited in time on its own; the run's end
				// waits only for what it left (killed now,
				// spawn.Group.Wait, or a descendant still holding stderr:
				// pipeGrace), which is no timeout of the command's — and
				// a cancel meanwhile still ends the run at once.
				expired = nil
			default:
				p.kill()
				timedOut = true
				break wait
			}
		}
	}
	// The command is gone. What it wrote is read to its end at the sink's
	// pace; only a descendant outside the group still holding stdout is not
	// waited for past pipeGrace (proc.Output).
	out.Exited()
	select {
	case <-copied:
	case <-ctx.Done():
		return ctx.Err()
	}
	if stdout.err != nil {
		return stdout.err
	}
	if err := stdout.flush(); err != nil {
		return err
	}
	if timedOut {
		return sink.Emit(domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{
			Code:    domain.CodeTimeout,
			Message: fmt.Sprintf("target %q timed out after %s", req.Target, timeout),
		}})
	}
	state := cmd.ProcessState
	switch {
	case state == nil:
		return sink.Emit(domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{
			Code: domain.CodeRunFailed, Message: fmt.Sprintf("wait for target %q: %v", req.Target, p.waitErr),
		}})
	case state.Success():
		// p.waitErr may be osexec.ErrWaitDelay: a descendant kept stderr
		// open after the command exited 0. The run still succeeded.
		return sink.Emit(domain.RunEvent{Type: domain.EventComplete, Usage: &domain.Usage{
			DurationMS: time.Since(started).Milliseconds(),
		}})
	default:
		msg := state.String() // "exit status N" or "signal: killed"
		if tail := stderr.String(); tail != "" {
			msg += ": " + tail
		}
		return sink.Emit(domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{
			Code: domain.CodeRunFailed, Message: msg,
		}})
	}
}

// command is osexec.Command(argv[0], argv[1:]...), except that a name
// without a slash is searched for in the PATH the child gets: env's when it
// declares one (a target's own toolchain directory), else the node's. It
// reuses what an earlier run found for the same name and PATH as long as
// that file is still an executable; otherwise PATH is searched again.
func (a *Adapter) command(argv []string, env map[string]string) *osexec.Cmd {
	name := argv[0]
	path, declared := env["PATH"]
	key := name
	if declared {
		key = name + "\x00" + path
	}
	if p, ok := a.found.Load(key); ok {
		if proc.Executable(p.(string)) {
			cmd := osexec.Command(p.(string), argv[1:]...)
			cmd.Args[0] = name // argv[0] as configured, as a PATH lookup leaves it
			return cmd
		}
		a.found.Delete(key)
	}
	cmd := osexec.Command(name, argv[1:]...)
	if declared && !strings.ContainsRune(name, filepath.Separator) {
		cmd.Path, cmd.Err = proc.LookPathIn(name, path)
	}
	if cmd.Err == nil && !strings.ContainsRune(name, filepath.Separator) && filepath.IsAbs(cmd.Path) {
		a.found.Store(key, cmd.Path)
	}
	return cmd
}

// process is a started command in its own process group, with a goroutine
// waiting for it.
type process struct {
	group   *spawn.Group
	done    chan struct{} // closed when group.Wait has returned
	waitErr error         // set before done is closed
}

// signal sends sig to every process in the group and to what the command
// started outside it (spawn.Group.Signal).
func (p *process) signal(sig syscall.Signal) { p.group.Signal(sig) }

// kill SIGKILLs the group and waits for the command; its Wait kills what
// may have been forked in between.
func (p *process) kill() {
	p.signal(syscall.SIGKILL)
	<-p.done
}

// terminate sends SIGTERM to the group, then SIGKILL if the command has not
// exited after grace, and waits for it.
func (p *process) terminate(grace time.Duration) {
	if grace <= 0 {
		p.kill()
		return
	}
	p.signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		p.kill()
	}
}
