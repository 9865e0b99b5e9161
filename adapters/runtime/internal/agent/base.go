package agent

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"

	"iop/domain"
	"iop/ports"
)

// Base is the part of a CLI agent adapter that does not depend on the CLI:
// its configuration, Capabilities and the session mappings. Adapters embed
// it and add their argv building and stream parsing. It is safe for
// concurrent use once built.
type Base struct {
	// KillGrace is the delay between SIGTERM and SIGKILL when a run is
	// cancelled. NewBase sets it to DefaultKillGrace; change it only
	// before the first run.
	KillGrace time.Duration
	// ExitGrace is how long a CLI may linger, silent, after the line that
	// ends its run before it is stopped. NewBase sets it to
	// DefaultExitGrace; change it only before the first run.
	ExitGrace time.Duration

	runner         Runner
	maxConcurrency int
	args           []string // cfg.Args: the CLI's extra arguments
}

// NewBase checks cfg for the adapter kind (as named in config errors, e.g.
// "claude-code") and builds the shell of an adapter whose CLI is named label
// in run messages and run as command when cfg names none; agents keeps the
// session mappings (nil: no sessions). Errors are domain.ErrConfig. cfg's
// slices and maps are copied.
func NewBase(cfg domain.AdapterConfig, agents ports.AgentSessionStore, kind, label, command string) (Base, error) {
	if cfg.MaxConcurrency < 0 || cfg.Timeout < 0 {
		return Base{}, domain.Errorf(domain.CodeConfigError, "%s adapter %q: max_concurrency and timeout must not be negative", kind, cfg.Name)
	}
	return Base{
		KillGrace: DefaultKillGrace,
		ExitGrace: DefaultExitGrace,
		runner: Runner{
			Name: cfg.Name, Label: label, Command: cmp.Or(cfg.Command, command), WorkDir: cfg.WorkDir,
			Models: slices.Clone(cfg.Models), Timeout: cfg.Timeout, Store: agents,
			Env: maps.Clone(cfg.Env), InheritEnv: slices.Clone(cfg.InheritEnv),
		},
		maxConcurrency: cmp.Or(cfg.MaxConcurrency, domain.DefaultMaxConcurrency),
		args:           slices.Clone(cfg.Args),
	}, nil
}

// ExtraArgs returns the configured extra arguments for the CLI; callers
// must not modify them.
func (b *Base) ExtraArgs() []string { return b.args }

// Capabilities reports the configured concurrency and sessions (when a
// store was given).
func (b *Base) Capabilities() domain.Capabilities {
	return domain.Capabilities{MaxConcurrency: b.maxConcurrency, Sessions: b.runner.Store != nil}
}

// TerminateSession forgets which agent session a session resumes; an
// unknown one is session_not_found.
func (b *Base) TerminateSession(ctx context.Context, _ string, sessionID string) error {
	return b.sessions().Terminate(ctx, sessionID)
}

// ListSessions returns the page q asks for of the stored session mappings.
func (b *Base) ListSessions(ctx context.Context, q domain.SessionQuery) ([]domain.SessionInfo, error) {
	return b.sessions().List(ctx, q)
}

func (b *Base) sessions() Sessions {
	return Sessions{Store: b.runner.Store, Name: b.runner.Name}
}

// Admit refuses, before the node acknowledges the run, a run Run would
// refuse for its content (Runner.Check: a blank prompt), so its caller gets
// an honest refusal rather than a started run that fails. It implements
// ports.RunAdmitter for the adapters that embed Base.
func (b *Base) Admit(req domain.RunRequest) error {
	return b.runner.Check(req)
}

// Run runs req as Runner.Execute does, with the current KillGrace and
// ExitGrace.
func (b *Base) Run(ctx context.Context, req domain.RunRequest, sink ports.EventSink, build func(model, resume, prompt string) Invocation, p Parser) error {
	r := b.runner
	r.KillGrace, r.ExitGrace = b.KillGrace, b.ExitGrace
	return r.Execute(ctx, req, sink, build, p)
}
