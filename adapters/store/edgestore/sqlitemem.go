package edgestore

import (
	"sync"

	"modernc.org/libc"
)

// holdAllocatorPages keeps the SQLite allocator's small-size pages mapped.
//
// SQLite here is modernc.org/sqlite, whose C heap is modernc.org/memory: an
// allocation of up to 16 KiB takes a slot of a 64 KiB page shared by its
// size class, and the page is unmapped the moment its last slot is freed.
// SQLite allocates and frees a scratch buffer of several KiB on every
// B-tree page split (balance_nonroot), so with nothing else live in that
// class each split of a history insert cost an mmap, page faults, zeroing
// and an munmap — a third of the writer's CPU in a profile under load.
// Holding one slot of each class for the life of the process (32 KiB in
// all) keeps those pages mapped and reused. The allocator is the process's,
// so this is done once.
var holdAllocatorPages = sync.OnceFunc(func() {
	tls := libc.NewTLS()
	defer tls.Close()
	for log := 4; log <= 14; log++ { // 16 B … 16 KiB, the slot classes
		libc.Xmalloc(tls, libc.Tsize_t(1)<<log) // never freed, by design
	}
})
