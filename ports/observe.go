package ports

import (
	"context"
	"time"

	"iop/domain"
)

// EdgeMetrics is what the edge's use cases report, in their own words; an
// adapter maps them to a metrics system. Every method is cheap and never
// blocks. Label-like arguments are bounded by the caller: node ids from the
// directory, adapters and providers from node configs, models that a node
// serves.
type EdgeMetrics interface {
	// NodeRegistration counts a registration attempt: outcome is
	// "accepted" or a rejection reason code (unknown_token, …).
	NodeRegistration(outcome string)
	// RunDispatched tells of a run the edge just sent to node's adapter,
	// before any outcome: the adapter starts that pair's outcome series at
	// 0, so the first run to end with an outcome shows in rate() and
	// increase() (a series born at 1 does not).
	RunDispatched(node, adapter string)
	// RunFinished counts a run dispatched by the edge that reached its
	// terminal event (runs in flight are read from the registry).
	RunFinished(r RunOutcome)
	// TunnelFinished counts one provider tunnel.
	TunnelFinished(t TunnelOutcome)
	// HistoryDropped counts history rows lost because the store could not
	// keep up or was unreachable.
	HistoryDropped(n int)
}

// RunOutcome is a finished run as metrics see it.
type RunOutcome struct {
	Node, Adapter string
	Status        domain.RunStatus
	Duration      time.Duration
	FirstEvent    time.Duration // 0 if no event came before the end
	Usage         *domain.Usage
}

// TunnelOutcome is a finished tunnel as metrics see it. Model is "" when
// no served model matched (the caller's string is not a label value).
type TunnelOutcome struct {
	Node, Provider, Model string
	Code                  string // the provider's HTTP status, or an error code
	FirstByte             time.Duration
	BytesIn, BytesOut     int64
	Usage                 *domain.Usage
}

// RunHistory records the edge's runs and tunnels. Its methods never block
// and never fail a run: a write that cannot be kept is dropped and counted.
type RunHistory interface {
	RecordRun(r domain.RunRecord)
	RecordTunnel(t domain.TunnelRecord)
}

// ResponseHistory finds, in the history, the tunnel that created a stored
// response (domain.TunnelRecord.Response).
type ResponseHistory interface {
	// ResponseOrigin returns the oldest tunnel recorded as creating
	// response id, with UsageCounted set as the history tells it; found
	// is false when the history holds none.
	ResponseOrigin(ctx context.Context, id string) (t domain.TunnelRecord, found bool, err error)
}

// HistoryReader answers from the history.
type HistoryReader interface {
	// GetRun returns domain.ErrRunNotFound for an unknown id.
	GetRun(ctx context.Context, id string) (domain.RunRecord, error)
	ListRuns(ctx context.Context, q domain.RunQuery) (domain.RunPage, error)
	Usage(ctx context.Context, q domain.UsageQuery) ([]domain.UsageTotal, error)
}
