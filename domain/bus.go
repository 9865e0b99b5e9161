package domain

import "time"

// Lifecycle and bus event types published on the edge's event bus.
const (
	BusNodeRegistered      = "node.registered"
	BusNodeRejected        = "node.rejected"
	BusNodeDisconnected    = "node.disconnected"
	BusNodeDraining        = "node.draining"
	BusNodeConfigRefreshed = "node.config_refreshed"
	BusRunEvent            = "run.event"
	BusTunnelCompleted     = "tunnel.completed"
	BusConfigReloaded      = "config.reloaded"
)

// BusTypes are every type the bus carries, in the order README lists them.
var BusTypes = []string{BusNodeRegistered, BusNodeRejected, BusNodeDraining, BusNodeDisconnected,
	BusNodeConfigRefreshed, BusConfigReloaded, BusRunEvent, BusTunnelCompleted}

// BusEvent is one message on the edge's in-process event bus. Exactly one of
// Run and Tunnel is set for run and tunnel events; lifecycle events carry
// Node and Reason. Provider body bytes never travel on the bus.
type BusEvent struct {
	Type   string
	Time   time.Time
	Node   string
	Reason string
	Remote string
	// Key names the API key of the caller that started the run or tunnel
	// ("anonymous" on an edge without keys); empty on lifecycle events.
	Key    string
	Run    *RunEvent
	Tunnel *TunnelSummary
}

// TunnelSummary describes a finished provider tunnel, without its body.
type TunnelSummary struct {
	ID string
	// Key names the caller's API key.
	Key       string
	Provider  string
	Model     string
	Path      string
	Status    int
	BodyBytes int64
	Duration  time.Duration
	Usage     *Usage
	Error     string
}
