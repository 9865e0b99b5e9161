package edge_test

import (
	"context"
	"testing"
	"time"

	"iop/application/edge"
	"iop/domain"
)

// pausingDir is a ucDir whose Authenticate, once armed, stops after it has
// found the record — the token checked against the directory as it was —
// until released, so a reload can run in between.
type pausingDir struct {
	*ucDir
	paused  chan struct{}
	release chan struct{}
}

func (d *pausingDir) Authenticate(token string) (domain.NodeRecord, error) {
	rec, err := d.ucDir.Authenticate(token)
	if d.paused != nil {
		close(d.paused)
		<-d.release
	}
	return rec, err
}

// A registration that authenticated against the directory before a reload
// replaced it, and reaches the registry only after, must not leave a node
// the reload removed (or whose token it rotated) connected: the reload's
// walk of the registry would have missed it for good.
func TestRegistrationRacingReloadDoesNotOutliveIt(t *testing.T) {
	for _, tc := range []struct {
		name       string
		next       func([]domain.NodeRecord) []domain.NodeRecord
		wantReason string
	}{
		{"node removed", func(r []domain.NodeRecord) []domain.NodeRecord { return r[1:] }, "removed from config"},
		{"token rotated", func(r []domain.NodeRecord) []domain.NodeRecord {
			r[0].Token = "reload-token-a-rotated-0000"
			return r
		}, "token changed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := &pausingDir{ucDir: &ucDir{recs: ucReloadRecords()}}
			reg, bus, versions := edge.NewRegistry(), newUCBus(), &edge.ConfigVersions{}
			h := edge.NewRegisterHandler(dir, reg, bus, versions, nil)
			rl := edge.NewReloadHandler(&ucSource{recs: tc.next(ucReloadRecords())}, dir, reg, bus, versions, nil)

			link := &ucLink{id: "a"}
			// Closing a link ends its connection, which the transport reports.
			link.onClose = func(reason string) { go h.Disconnected("a", link, reason) }
			dir.paused, dir.release = make(chan struct{}), make(chan struct{})
			registered := make(chan error, 1)
			go func() {
				_, err := h.Register(context.Background(), ucTokA, domain.NodeInfo{AdapterTypes: []string{"exec"}}, "10.0.0.1:1", link)
				registered <- err
			}()
			<-dir.paused // a's token was checked against the old directory

			reloaded := make(chan error, 1)
			go func() {
				_, err := rl.Handle(context.Background())
				reloaded <- err
			}()
			// Give the reload its chance to finish before the registration
			// goes on (it may also wait for the registration: either order
			// must end with a gone).
			var reloadErr error
			reloadDone := false
			select {
			case reloadErr = <-reloaded:
				reloadDone = true
			case <-time.After(200 * time.Millisecond):
			}
			close(dir.release)
			var regErr error
			ucWithin(t, "register", func() { regErr = <-registered })
			if !reloadDone {
				ucWithin(t, "reload", func() { reloadErr = <-reloaded })
			}
			if reloadErr != nil {
				t.Fatalf("reload: %v", reloadErr)
			}
			if regErr == nil {
				ucEventually(t, "a's link closed and a gone from the registry", func() bool {
					_, ok := reg.Get("a")
					return !ok
				})
				if _, _, _, _, _, closes := link.snapshot(); len(closes) != 1 || closes[0] != tc.wantReason {
					t.Fatalf("a's link closed with %q, want %q", closes, tc.wantReason)
				}
			} else if _, ok := reg.Get("a"); ok {
				t.Fatalf("a refused (%v) yet in the registry", regErr)
			}
		})
	}
}
