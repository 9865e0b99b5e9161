package sqlprep

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/uptrace/bun/driver/sqliteshim"
	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

func TestCachePreparesOnceAndRetriesAFailure(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open(sqliteshim.ShimName, "file::memory:")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	defer db.Close()
	c := Cache{DB: db}
	defer c.Close()

	const q = "INSERT INTO t (v) VALUES ($1)"
	if _, err := c.Get(ctx, q); err == nil {
		t.Fatal("prepared a statement on a table that does not exist")
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE t (v INTEGER)"); err != nil {
		t.Fatal(err)
	}
	st, err := c.Get(ctx, q)
	if err != nil {
		t.Fatalf("the failed prepare was not tried again: %v", err)
	}
	if again, _ := c.Get(ctx, q); again != st {
		t.Fatal("the same query was prepared twice")
	}
	if _, err := st.ExecContext(ctx, 7); err != nil {
		t.Fatal(err)
	}
}

// TestMain prepares the heap before any test opens a database, as the
// stores do before they open theirs.
func TestMain(m *testing.M) {
	HoldAllocatorPages()
	os.Exit(m.Run())
}

// TestSplitsTakeScratchFromThePool: B-tree splits of a 2 KiB-page database
// borrow their page-sized buffers from the pool (which then shows more
// slots in use at its high-water mark than the connection holds for good)
// instead of the C heap, where each such buffer cost an mmap and an munmap.
func TestSplitsTakeScratchFromThePool(t *testing.T) {
	if HoldAllocatorPages(); !scratchPool {
		t.Fatal("SQLite refused the scratch pool although no database was open before it")
	}
	ctx := context.Background()
	db, err := sql.Open(sqliteshim.ShimName, "file:"+filepath.Join(t.TempDir(), "split.db")+"?mode=rwc")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	defer db.Close()
	for _, q := range []string{fmt.Sprintf("PRAGMA page_size = %d", ScratchPageSize), "PRAGMA journal_mode = WAL",
		"CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)", "INSERT INTO t VALUES ('a', 'b')"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	base := poolSlotsInUse(t, true) // the connection's own buffers; resets the high-water mark
	for i := range 2000 {           // random keys: the index splits all over
		if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (?, ?)", fmt.Sprintf("%08x-%d", rand.Uint32(), i), strings.Repeat("v", 40)); err != nil {
			t.Fatal(err)
		}
	}
	if hw := poolSlotsInUse(t, false); hw <= base {
		t.Fatalf("pool high-water mark %d after 2,000 inserts, %d before: splits did not use the pool", hw, base)
	}
}

// poolSlotsInUse returns SQLite's count of pool slots in use now (reset:
// and makes it the high-water mark) or its high-water mark.
func poolSlotsInUse(t *testing.T, reset bool) int32 {
	tls := libc.NewTLS()
	defer tls.Close()
	p := libc.Xmalloc(tls, 8)
	defer libc.Xfree(tls, p)
	r := int32(0)
	if reset {
		r = 1
	}
	if rc := sqlite3.Xsqlite3_status(tls, sqlite3.SQLITE_STATUS_PAGECACHE_USED, p, p+4, r); rc != sqlite3.SQLITE_OK {
		t.Fatalf("sqlite3_status: %d", rc)
	}
	b := libc.GoBytes(p, 8) // current, then high-water mark: two C ints
	if reset {
		return int32(binary.NativeEndian.Uint32(b))
	}
	return int32(binary.NativeEndian.Uint32(b[4:]))
}
