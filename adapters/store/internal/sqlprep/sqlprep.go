// Package sqlprep holds what the SQLite stores share to keep their hot
// writes cheap: statements prepared once, and the C heap's pages held.
package sqlprep

import (
	"context"
	"database/sql"
	"sync"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// Cache holds statements prepared once per query on db. SQL that bun builds
// has every value spelled into its text, so SQLite parses and plans each one
// afresh; a statement prepared with placeholders ($N, or ?, which SQLite and
// PostgreSQL both accept as written by the caller) is parsed once. With
// SQLite's one pooled connection that is once per process. Safe for
// concurrent use; the zero Cache needs DB set.
type Cache struct {
	DB *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// Get returns query prepared, preparing it on first use; a failed prepare
// is returned and tried again on the next call.
func (c *Cache) Get(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.m[query]; ok {
		return st, nil
	}
	st, err := c.DB.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[string]*sql.Stmt{}
	}
	c.m[query] = st
	return st, nil
}

// Close closes every statement; call it before the database closes.
func (c *Cache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.m {
		_ = st.Close()
	}
	c.m = nil
}

// HoldAllocatorPages keeps the SQLite allocator's small-size pages mapped,
// and gives SQLite a pool for its page-sized scratch buffers. Call it before
// the process opens its first SQLite database.
//
// SQLite here is modernc.org/sqlite, whose C heap is modernc.org/memory: an
// allocation of up to 16 KiB takes a slot of a 64 KiB page shared by its
// size class, and the page is unmapped the moment its last slot is freed.
// SQLite allocates and frees a scratch buffer of several KiB on every
// B-tree page split (balance_nonroot), so with nothing else live in that
// class each split of an insert cost an mmap, page faults, zeroing and an
// munmap — a third of the edge history writer's CPU in a profile under
// load. Holding one slot of each class for the life of the process (32 KiB
// in all) keeps those pages mapped and reused. The allocator is the
// process's, so this is done once, by whichever SQLite store opens first.
//
// The held slot does not cover a split's other buffer, one page of the
// database (sqlite3PageMalloc): it shares its size class with the page
// cache's entries (a page plus its headers), which fill that class's pages
// to the last slot once the cache stops growing, and then every split
// mapped a fresh page for the buffer and unmapped it again (with the TLB
// shootdown an munmap costs a threaded process) — 6 % of the edge's CPU
// under run load in one profile. SQLite takes such buffers from its
// SQLITE_CONFIG_PAGECACHE pool first when they fit a slot; with slots of
// exactly ScratchPageSize bytes only those buffers fit, as long as no
// database of this process has smaller pages (a cache entry is a page
// plus headers; the stores' pages are 2 KiB or 4 KiB), so the pool serves
// them and nothing else, and a split costs no system call. Databases with
// larger pages (the node store's, history files made before the edge moved
// to 2 KiB pages) do not fit and allocate as before. The pool must be set
// before SQLite starts: when another database was opened first, SQLite
// refuses it and splits go on as before.
var HoldAllocatorPages = sync.OnceFunc(func() {
	tls := libc.NewTLS()
	defer tls.Close()
	for log := 4; log <= 14; log++ { // 16 B … 16 KiB, the slot classes
		libc.Xmalloc(tls, libc.Tsize_t(1)<<log) // never freed, by design
	}
	pool := libc.Xmalloc(tls, libc.Tsize_t(ScratchPageSize*scratchSlots)) // never freed: SQLite keeps it
	if pool == 0 {
		return // no memory: SQLite allocates as before
	}
	va := libc.NewVaList(pool, int32(ScratchPageSize), int32(scratchSlots))
	defer libc.Xfree(tls, va)
	scratchPool = sqlite3.Xsqlite3_config(tls, sqlite3.SQLITE_CONFIG_PAGECACHE, va) == sqlite3.SQLITE_OK
})

// ScratchPageSize is the page size of the databases whose page-sized
// buffers come from the pool (the edge history's 2 KiB pages).
const ScratchPageSize = 2048

// scratchSlots bounds the buffers the pool serves at once: a connection
// to a 2 KiB-page database keeps one for good (its B-tree's; the pager's
// is 8 bytes larger and never fits) and a split holds two while it runs,
// so the edge's one connection uses at most three; past the pool SQLite
// falls back to its heap, as without one.
const scratchSlots = 16

// scratchPool reports whether SQLite took the pool (HoldAllocatorPages):
// false when another SQLite database was opened before it ran.
var scratchPool bool
