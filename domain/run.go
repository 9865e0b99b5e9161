package domain

import (
	"cmp"
	"errors"
	"fmt"
	"time"
)

// RunStatus is where a run is in its life.
type RunStatus string

const (
	RunQueued    RunStatus = "queued"
	RunRunning   RunStatus = "running"
	RunSucceeded RunStatus = "succeeded"
	RunFailed    RunStatus = "failed"
	RunCancelled RunStatus = "cancelled"
)

// Finished reports whether s is a final status.
func (s RunStatus) Finished() bool {
	return s == RunSucceeded || s == RunFailed || s == RunCancelled
}

// Valid reports whether s is a known status.
func (s RunStatus) Valid() bool {
	switch s {
	case RunQueued, RunRunning, RunSucceeded, RunFailed, RunCancelled:
		return true
	}
	return false
}

// StatusFor maps a terminal event type to the final run status.
func StatusFor(t EventType) RunStatus {
	switch t {
	case EventComplete:
		return RunSucceeded
	case EventCancelled:
		return RunCancelled
	default:
		return RunFailed
	}
}

// ErrRunAlreadyFinished is returned by transitions on a finished run.
var ErrRunAlreadyFinished = errors.New("run already finished")

// RunRequest is what the edge asks a node to execute.
type RunRequest struct {
	RunID      string
	Adapter    string
	Target     string
	Input      []byte
	SessionID  string
	Background bool
	Options    []byte // JSON object with adapter-specific options; may be nil
}

// Validate checks the fields every run needs.
func (r RunRequest) Validate() error {
	if err := CheckIDs("run_id", r.RunID, "adapter", r.Adapter, "target", r.Target, "session_id", r.SessionID); err != nil {
		return err
	}
	switch {
	case r.RunID == "":
		return Errorf(CodeInvalidRequest, "run id is required")
	case r.Adapter == "":
		return Errorf(CodeInvalidRequest, "adapter is required")
	}
	return nil
}

// Run is a run as recorded in a node's local store.
type Run struct {
	id         string
	adapter    string
	target     string
	sessionID  string
	background bool
	status     RunStatus
	createdAt  time.Time
	startedAt  time.Time
	finishedAt time.Time
	errCode    string
	errMessage string
	usage      *Usage
}

// NewRun creates a queued run for req at time now.
func NewRun(req RunRequest, now time.Time) (*Run, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return &Run{
		id: req.RunID, adapter: req.Adapter, target: req.Target, sessionID: req.SessionID,
		background: req.Background, status: RunQueued, createdAt: now,
	}, nil
}

// RunSnapshot carries every field of a Run; it exists to rehydrate runs from
// storage (RehydrateRun) and to read them without getters (Snapshot).
type RunSnapshot struct {
	ID           string
	Adapter      string
	Target       string
	SessionID    string
	Background   bool
	Status       RunStatus
	CreatedAt    time.Time
	StartedAt    time.Time
	FinishedAt   time.Time
	ErrorCode    string
	ErrorMessage string
	Usage        *Usage
}

// RehydrateRun rebuilds a Run from stored fields. It is for store adapters
// only and checks just that the snapshot is self-consistent.
func RehydrateRun(s RunSnapshot) (*Run, error) {
	if s.ID == "" || !s.Status.Valid() {
		return nil, fmt.Errorf("rehydrate run %q: invalid snapshot (status %q)", s.ID, s.Status)
	}
	return &Run{
		id: s.ID, adapter: s.Adapter, target: s.Target, sessionID: s.SessionID, background: s.Background,
		status: s.Status, createdAt: s.CreatedAt, startedAt: s.StartedAt, finishedAt: s.FinishedAt,
		errCode: s.ErrorCode, errMessage: s.ErrorMessage, usage: s.Usage,
	}, nil
}

// Snapshot returns a copy of every field.
func (r *Run) Snapshot() RunSnapshot {
	return RunSnapshot{
		ID: r.id, Adapter: r.adapter, Target: r.target, SessionID: r.sessionID, Background: r.background,
		Status: r.status, CreatedAt: r.createdAt, StartedAt: r.startedAt, FinishedAt: r.finishedAt,
		ErrorCode: r.errCode, ErrorMessage: r.errMessage, Usage: r.usage,
	}
}

func (r *Run) ID() string        { return r.id }
func (r *Run) Status() RunStatus { return r.status }

// Start moves a queued run to running.
func (r *Run) Start(now time.Time) error {
	if r.status.Finished() {
		return ErrRunAlreadyFinished
	}
	r.status = RunRunning
	r.startedAt = now
	return nil
}

// Finish records the run's terminal event. A run finishes once.
func (r *Run) Finish(ev RunEvent, now time.Time) error {
	if r.status.Finished() {
		return ErrRunAlreadyFinished
	}
	if !ev.Type.Terminal() {
		return fmt.Errorf("finish run %s with non-terminal event %q", r.id, ev.Type)
	}
	r.status = StatusFor(ev.Type)
	r.finishedAt = now
	if ev.Error != nil {
		r.errCode, r.errMessage = ev.Error.Code, ev.Error.Message
	}
	if ev.Usage != nil {
		u := *ev.Usage
		r.usage = &u
	}
	return nil
}

// Page sizes of a listing of a node's runs (ListRuns, the runs command).
const (
	DefaultRunPage = 50
	MaxRunPage     = 1000
)

// RunFilter selects runs from a node's store; zero fields match everything.
// A store lists them newest first, ties on CreatedAt broken by id, both
// descending (RunKey): at most PageLimit of them, those after After when
// it is set, so a listing continues page by page however many runs share
// a creation time or are added meanwhile.
type RunFilter struct {
	Status  RunStatus
	Adapter string
	Limit   int // see PageLimit
	After   *RunKey
}

// PageLimit is how many runs f asks for: Limit, DefaultRunPage when it is
// not positive, and at most one more than MaxRunPage (what the runs
// command asks for, to tell whether more follow a page).
func (f RunFilter) PageLimit() int {
	if f.Limit <= 0 {
		return DefaultRunPage
	}
	return min(f.Limit, MaxRunPage+1)
}

// RunKey is where a run stands in a listing of a node's runs: newest first
// by CreatedAt (as the store returned it), ties broken by ID, descending.
type RunKey struct {
	CreatedAt time.Time
	ID        string
}

// Key is the run's place in a run listing.
func (s RunSnapshot) Key() RunKey { return RunKey{CreatedAt: s.CreatedAt, ID: s.ID} }

// Compare orders run keys as a run listing does (newest first, then by
// id, descending): negative when k comes before o.
func (k RunKey) Compare(o RunKey) int {
	if c := o.CreatedAt.Compare(k.CreatedAt); c != 0 {
		return c
	}
	return cmp.Compare(o.ID, k.ID)
}

// Before reports whether k comes before o in a run listing.
func (k RunKey) Before(o RunKey) bool { return k.Compare(o) < 0 }

// UsageSummary aggregates one adapter's runs and token usage.
type UsageSummary struct {
	Adapter          string
	RunsTotal        int64
	Succeeded        int64
	Failed           int64
	Cancelled        int64
	Running          int64
	PromptTokens     int64
	CompletionTokens int64
	TotalTokens      int64
	CostUSD          float64
}
