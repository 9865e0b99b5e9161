package edge

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"iop/domain"
	"iop/ports"
)

// RegisterHandler admits nodes that present a known token and reports every
// lifecycle change on the bus. Its methods are what the edge transport
// calls; tokens never reach logs or events.
type RegisterHandler struct {
	// BindIdentity requires the connection's verified client certificate
	// to name the node the token belongs to (transport.tls.bind_node_identity).
	BindIdentity bool

	dir      ports.NodeDirectory
	reg      *Registry
	bus      ports.EventPublisher
	log      *slog.Logger
	now      func() time.Time
	versions *ConfigVersions
	rejects  *rejectLog
	// Metrics, if set, counts registrations by outcome.
	Metrics ports.EdgeMetrics
	// Reconcile, if set, repairs a registering node's history rows left
	// running; Close stops it.
	Reconcile *HistoryReconciler
	// Orphans, if set, cancels on a registering node the background runs
	// dispatched to it as its last link broke; Close stops it.
	Orphans *OrphanCancels
}

// RejectLogInterval is the period over which refusals from one address are
// counted into one log line.
const RejectLogInterval = 10 * time.Second

// NewRegisterHandler refuses nil dependencies. versions is shared with the
// reload use case so config versions only grow.
func NewRegisterHandler(dir ports.NodeDirectory, reg *Registry, bus ports.EventPublisher, versions *ConfigVersions, log *slog.Logger) *RegisterHandler {
	if dir == nil || reg == nil || bus == nil || versions == nil {
		panic("edge.NewRegisterHandler: nil dependency")
	}
	if log == nil {
		log = slog.Default()
	}
	return &RegisterHandler{dir: dir, reg: reg, bus: bus, log: log, now: time.Now, versions: versions,
		rejects: newRejectLog(log, RejectLogInterval)}
}

// Close logs the refusal counts not yet logged and stops their timers.
func (h *RegisterHandler) Close() {
	h.rejects.close()
	h.Reconcile.Close()
	h.Orphans.Close()
}

// ConfigVersions hands out increasing config payload versions.
type ConfigVersions struct{ n atomic.Uint64 }

// Next returns a version larger than every one before.
func (v *ConfigVersions) Next() uint64 { return v.n.Add(1) }

// Register authenticates token, builds the node's config and admits link.
// Rejections are unknown_token, identity_mismatch (BindIdentity),
// duplicate_connection and config_error.
func (h *RegisterHandler) Register(_ context.Context, token string, info domain.NodeInfo, remote string, link ports.NodeLink) (domain.NodeConfig, error) {
	id, cfg, err := h.admit(token, info, remote, link)
	if err != nil {
		return h.reject(id, remote, err)
	}
	h.countRegistration(OutcomeAccepted)
	h.log.Info("node registered", "node", id, "remote", remote, "version", info.Version, "adapters", len(cfg.Adapters))
	h.bus.Publish(domain.BusEvent{Type: domain.BusNodeRegistered, Time: h.now(), Node: id, Remote: remote})
	h.Reconcile.NodeRegistered(id)
	h.Orphans.NodeRegistered(id)
	return cfg, nil
}

// admit authenticates token and admits link as its node, as one step with
// respect to a reload (Registry.admission): a reload either replaced the
// directory first, and the token is checked against the new one, or waits
// until the node is in the registry, and then disconnects it if the new
// directory no longer allows it. It returns the node id once known.
func (h *RegisterHandler) admit(token string, info domain.NodeInfo, remote string, link ports.NodeLink) (string, domain.NodeConfig, error) {
	h.reg.admission.RLock()
	defer h.reg.admission.RUnlock()
	rec, err := h.dir.Authenticate(token)
	if err != nil {
		if !errors.Is(err, domain.ErrUnknownToken) {
			h.log.Error("node directory failed", "err", err)
		}
		return "", domain.NodeConfig{}, &domain.Error{Code: domain.CodeUnknownToken}
	}
	if h.BindIdentity && !info.Peer.Names(rec.ID) {
		return rec.ID, domain.NodeConfig{}, domain.Errorf(domain.CodeIdentityMismatch,
			"the client certificate names %q, not node %q", info.Peer.CertNames, rec.ID)
	}
	cfg, err := rec.BuildConfig(h.versions.Next())
	if err == nil {
		err = cfg.CheckAdapterTypes(info)
	}
	if f, ok := link.(configFitter); ok && err == nil {
		err = f.ConfigFits(cfg)
	}
	if err != nil {
		return rec.ID, domain.NodeConfig{}, err
	}
	n := &LiveNode{ID: rec.ID, Link: link, Info: info, Remote: remote, ConnectedAt: h.now(), Config: cfg}
	if err := h.reg.Admit(n); err != nil {
		return rec.ID, domain.NodeConfig{}, err
	}
	return rec.ID, cfg, nil
}

// configFitter is a link that can tell a config too large to send it
// (a config_error): such a node is refused, not admitted and then cut off.
type configFitter interface {
	ConfigFits(domain.NodeConfig) error
}

func (h *RegisterHandler) reject(node, remote string, err error) (domain.NodeConfig, error) {
	h.countRegistration(domain.CodeOf(err))
	h.rejects.note("node rejected", remote, node, err.Error())
	h.bus.Publish(domain.BusEvent{Type: domain.BusNodeRejected, Time: h.now(), Node: node, Remote: remote, Reason: err.Error()})
	return domain.NodeConfig{}, err
}

// Disconnected removes a node from the live registry and reports it. A
// node that said it was stopping on that link (Registry.MarkStopping; a
// reload's drain mark is no such word) left as it meant to: its reason
// says so, and it is logged at info, not as a fault
// (a routine restart read "peer closed the connection: EOF", at warn, as
// a crash did).
func (h *RegisterHandler) Disconnected(nodeID string, link ports.NodeLink, reason string) {
	stopping := h.reg.Stopping(nodeID, link)
	if stopping {
		reason = StoppedReason + ": " + reason
	}
	if !h.reg.leave(nodeID, link, reason) {
		return
	}
	if stopping {
		h.log.Info("node disconnected", "node", nodeID, "reason", reason)
	} else {
		h.log.Warn("node disconnected", "node", nodeID, "reason", reason)
	}
	h.bus.Publish(domain.BusEvent{Type: domain.BusNodeDisconnected, Time: h.now(), Node: nodeID, Reason: reason})
}

// StoppedReason begins the disconnect reason of a node whose link ended
// while it was stopping (draining).
const StoppedReason = "the node was stopping"

// Draining takes a node's word that it is stopping: no new run goes to it
// while its runs in flight end. Reported once per link.
func (h *RegisterHandler) Draining(nodeID string, link ports.NodeLink) {
	announceDraining(h.reg, h.bus, h.log, h.now(), nodeID, link, "the node is stopping")
}

// announceDraining marks node id, while served by link, draining
// (Registry.MarkDraining) and, the first time, logs and publishes it with
// why.
func announceDraining(reg *Registry, bus ports.EventPublisher, log *slog.Logger, at time.Time, id string, link ports.NodeLink, why string) {
	if !reg.MarkStopping(id, link) {
		return
	}
	log.Info("node draining: no new runs or provider requests go to it", "node", id, "reason", why)
	bus.Publish(domain.BusEvent{Type: domain.BusNodeDraining, Time: at, Node: id, Reason: why})
}

// HandshakeFailed reports a connection that never registered.
func (h *RegisterHandler) HandshakeFailed(remote, reason string) {
	h.countRegistration(OutcomeHandshakeFailed)
	// A flood of these is counted, not logged or published one by one.
	if h.rejects.note("node handshake failed", remote, "", reason) {
		h.bus.Publish(domain.BusEvent{Type: domain.BusNodeRejected, Time: h.now(), Remote: remote, Reason: reason})
	}
}

// HandshakeFailedUnreported counts a failed handshake the transport did
// not report (a flood, rate-limited there): the metric counts every one.
func (h *RegisterHandler) HandshakeFailedUnreported() {
	h.countRegistration(OutcomeHandshakeFailed)
}

// Registration outcomes besides the refusal codes.
const (
	OutcomeAccepted        = "accepted"
	OutcomeHandshakeFailed = "handshake_failed"
)

// RegistrationOutcomes are every outcome the handler counts
// (ports.EdgeMetrics.NodeRegistration): a metrics adapter starts each at 0,
// so the first refusals of a kind show in rate() and increase().
var RegistrationOutcomes = []string{OutcomeAccepted, domain.CodeUnknownToken, domain.CodeDuplicateConn,
	domain.CodeIdentityMismatch, domain.CodeConfigError, OutcomeHandshakeFailed}

func (h *RegisterHandler) countRegistration(outcome string) {
	if h.Metrics != nil {
		h.Metrics.NodeRegistration(outcome)
	}
}
