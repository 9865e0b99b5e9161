package edge

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"iop/domain"
	"iop/ports"
)

// Bounds of the orphan cancels.
const (
	orphanMax     = 1024             // remembered runs, all nodes; the oldest goes first
	orphanTimeout = 10 * time.Second // per cancel sent
)

// OrphanCancels cancels, when their node registers again, the background
// runs whose link broke before the node answered their dispatch. The edge
// told such a run's caller node_disconnected (no run id) and recorded it
// failed, yet the node may have got it and, a background run outliving
// its link, be running it: a caller retrying would then have it run twice.
// So too the background runs the edge withdrew before their admission (the
// caller left, or the node did not answer in time) whose cancel did not
// reach the node: on a half-open link the cancel fails, and the link may
// be declared dead only after the edge stopped following the run.
// A cancel for a run the node never got costs it a short-lived tombstone.
//
// It owns the goroutines that send the cancels; Close stops them.
type OrphanCancels struct {
	reg *Registry
	log *slog.Logger

	mu     sync.Mutex
	byNode map[string][]orphan // oldest first
	total  int
	closed bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// NewOrphanCancels refuses a nil registry.
func NewOrphanCancels(reg *Registry, log *slog.Logger) *OrphanCancels {
	if reg == nil {
		panic("edge.NewOrphanCancels: nil registry")
	}
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &OrphanCancels{reg: reg, log: log, byNode: map[string][]orphan{}, ctx: ctx, cancel: cancel}
}

// orphan is a remembered run and the reason its cancel gives (the run's
// message in the node's store and the edge's history).
type orphan struct {
	run, reason string
}

// add remembers run on node, which went out on link, to be cancelled for
// reason (CancelLinkBroke if empty), dropping the oldest remembered run
// when full. A node already back on another link (it registered before the
// lost run got here) gets the cancel at once.
func (o *OrphanCancels) add(node, run string, link ports.NodeLink, reason string) {
	if o == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	if reason == "" {
		reason = CancelLinkBroke
	}
	r := orphan{run, reason}
	if n, ok := o.reg.Get(node); ok && n.Link != link {
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			o.send(node, r)
		}()
		return
	}
	if o.total >= orphanMax {
		o.dropOldestLocked()
	}
	o.byNode[node] = append(o.byNode[node], r)
	o.total++
}

// dropOldestLocked drops the first run of the node with the longest list:
// not strictly the oldest overall, but bounded work and a node that never
// comes back pays first.
func (o *OrphanCancels) dropOldestLocked() {
	var worst string
	for n, runs := range o.byNode {
		if worst == "" || len(runs) > len(o.byNode[worst]) {
			worst = n
		}
	}
	runs := o.byNode[worst]
	if len(runs) <= 1 {
		delete(o.byNode, worst)
	} else {
		o.byNode[worst] = runs[1:]
	}
	o.total--
}

// NodeRegistered sends node the cancels remembered for it, without
// blocking the registration.
func (o *OrphanCancels) NodeRegistered(node string) {
	if o == nil {
		return
	}
	o.mu.Lock()
	runs := o.byNode[node]
	if o.closed || len(runs) == 0 {
		o.mu.Unlock()
		return
	}
	delete(o.byNode, node)
	o.total -= len(runs)
	o.wg.Add(1)
	o.mu.Unlock()
	go func() {
		defer o.wg.Done()
		for _, r := range runs {
			o.send(node, r)
		}
	}()
}

func (o *OrphanCancels) send(node string, r orphan) {
	n, ok := o.reg.Get(node)
	if !ok || o.ctx.Err() != nil {
		return
	}
	ctx, cancel := context.WithTimeout(o.ctx, orphanTimeout)
	defer cancel()
	switch err := n.Link.CancelRun(ctx, r.run, r.reason); domain.CodeOf(err) {
	case "":
		o.log.Info("cancelled a background run its node got though the edge had let go of it before its admission", "run", r.run, "node", node, "reason", r.reason)
	case domain.CodeRunNotFound, domain.CodeRunFinished:
	default:
		o.log.Warn("could not cancel a background run the edge let go of before its admission", "run", r.run, "node", node, "reason", r.reason, "err", err)
	}
}

// Close stops sending and waits for the cancels in flight.
func (o *OrphanCancels) Close() {
	if o == nil {
		return
	}
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.cancel()
	o.wg.Wait()
}
