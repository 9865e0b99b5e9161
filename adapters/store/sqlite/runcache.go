package sqlite

import (
	"sync"

	"iop/domain"
)

// maxUnfinished bounds unfinished: past it, runs are still recorded, only
// their updates take the read-back path.
const maxUnfinished = 4096

// unfinished holds the state of the runs this process created on a SQLite
// database and has not finished. The node updates each run once, to finish
// it; with the state at hand, UpdateRun applies fn to it and writes the
// result in one statement, instead of a transaction that reads the row back
// first (that read and the transaction around it were about half of a run's
// store cost).
//
// Every in-process write of a run goes through CreateRun and UpdateRun,
// which record what they wrote once it is committed; a run's writes come
// one after the other (the node's run manager records its start, then its
// end). Anything else, two updates of one run at once or a write from
// outside the process (the sqlite3 shell), is caught by the update's guard
// on the stored status: a run's status only moves forward (queued, running,
// finished), so a status that still matches means the rest of the state
// does too. When no row matches, the entry is dropped and the update takes
// the read-back path, calling fn again on the stored run. Not used on
// PostgreSQL, whose pool runs updates concurrently.
type unfinished struct {
	mu sync.Mutex
	m  map[string]domain.RunSnapshot
}

// put records s as the run's state, or forgets the run once finished.
func (u *unfinished) put(s domain.RunSnapshot) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if s.Status.Finished() {
		delete(u.m, s.ID)
		return
	}
	if u.m == nil {
		u.m = map[string]domain.RunSnapshot{}
	}
	if _, ok := u.m[s.ID]; !ok && len(u.m) >= maxUnfinished {
		return
	}
	s.Usage = cloneUsage(s.Usage)
	u.m[s.ID] = s
}

// forget drops the run's recorded state.
func (u *unfinished) forget(id string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.m, id)
}

// get returns a run rebuilt from the recorded state.
func (u *unfinished) get(id string) (*domain.Run, domain.RunSnapshot, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	s, ok := u.m[id]
	if !ok {
		return nil, s, false
	}
	c := s
	c.Usage = cloneUsage(s.Usage)
	run, err := domain.RehydrateRun(c)
	if err != nil {
		delete(u.m, id)
		return nil, s, false
	}
	return run, s, true
}

func cloneUsage(u *domain.Usage) *domain.Usage {
	if u == nil {
		return nil
	}
	c := *u
	return &c
}
