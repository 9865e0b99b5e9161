package edge

import (
	"context"
	"sync"

	"iop/domain"
	"iop/ports"
)

// Bounds of the repair run when a node registers.
const (
	reconcileQueue   = 64  // registrations waiting; more are dropped (GET /v1/runs/{id} still repairs)
	reconcileMaxRuns = 200 // running rows looked at per registration
)

// HistoryReconciler repairs, when a node registers, that node's history
// rows left running by an edge that stopped before their ends were written:
// each run whose end this edge process does not record itself (not in
// flight here, its end not seen here) is asked of the node, and a final
// status it reports is recorded. It owns one goroutine, stopped by
// Close.
type HistoryReconciler struct {
	history *RunHistoryHandler
	store   ports.HistoryReader

	queue  chan string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
}

// NewHistoryReconciler starts the worker; it does nothing unless history
// can ask nodes and record (its Nodes and Record are set).
func NewHistoryReconciler(history *RunHistoryHandler) *HistoryReconciler {
	if history == nil {
		panic("edge.NewHistoryReconciler: nil history")
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &HistoryReconciler{history: history, store: history.store, queue: make(chan string, reconcileQueue), ctx: ctx, cancel: cancel}
	r.wg.Add(1)
	go r.work()
	return r
}

// NodeRegistered queues node for a repair without blocking.
func (r *HistoryReconciler) NodeRegistered(node string) {
	if r == nil || r.ctx.Err() != nil {
		return
	}
	select {
	case r.queue <- node:
	default:
	}
}

// Close stops the worker and waits for it.
func (r *HistoryReconciler) Close() {
	if r == nil {
		return
	}
	r.once.Do(func() {
		r.cancel()
		r.wg.Wait()
	})
}

func (r *HistoryReconciler) work() {
	defer r.wg.Done()
	for {
		select {
		case <-r.ctx.Done():
			return
		case node := <-r.queue:
			r.repair(node)
		}
	}
}

// repair looks at node's running rows one by one (reconcile asks the node
// only for runs whose end this edge does not record itself).
func (r *HistoryReconciler) repair(node string) {
	page, err := r.store.ListRuns(r.ctx, domain.RunQuery{Node: node, Status: domain.RunRunning, Limit: reconcileMaxRuns})
	if err != nil {
		return // the history is unreachable; a later read repairs
	}
	for _, rec := range page.Runs {
		if r.ctx.Err() != nil {
			return
		}
		r.history.reconcile(r.ctx, rec)
	}
}
