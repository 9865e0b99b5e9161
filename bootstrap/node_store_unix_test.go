//go:build unix

package bootstrap_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"iop/bootstrap"
)

// A node whose store is named by a symlink to a database not created yet
// keeps its child-process record next to the file the link names, beside
// the lock that file's name takes (sqlite.LockFile): kept next to the link,
// it was another record than the one a node naming the file itself (or a
// later node resolving the now existing link) would read, and the lock and
// the record disagreed about which store they belong to. A second node on
// the same link is refused.
func TestNodeKeepsItsStoreFilesNextToTheLinkTarget(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "iop.db")
	if err := os.Symlink(filepath.Join(data, "real.db"), link); err != nil {
		t.Fatal(err)
	}
	settings := bootstrap.NodeSettings{
		// Nothing listens there: the node keeps retrying, which is all
		// this test needs of its link.
		Edge: "127.0.0.1:1", Token: "x", Logger: quiet(), MinBackoff: time.Hour,
		DB: "file:" + link + "?cache=shared&mode=rwc",
	}
	node := fxtest.New(t, bootstrap.Node(settings), fx.NopLogger)
	node.RequireStart()
	defer node.RequireStop()

	for _, f := range []string{"real.db", "real.db.lock", "real.db.children"} {
		if _, err := os.Stat(filepath.Join(data, f)); err != nil {
			t.Errorf("%s next to the link's target: %v", f, err)
		}
	}
	for _, f := range []string{"iop.db.lock", "iop.db.children"} {
		if _, err := os.Lstat(filepath.Join(dir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s next to the link: %v, want none", f, err)
		}
	}

	second := fx.New(bootstrap.Node(settings), fx.NopLogger)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := second.Start(ctx); err == nil || !strings.Contains(err.Error(), "another iop-node is using "+link) {
		_ = second.Stop(ctx)
		t.Fatalf("second node on the same link: %v, want another iop-node is using %s", err, link)
	}
}
