package transport

import "sync"

// Data frame buffers come from size-classed pools shared by all
// connections: a payload read off the wire, or a frame encoded by a sender,
// lives in one until the consumer or the writer is done with it. Classes
// double from 512 B to 64 KiB, so a buffer is at most about twice its
// contents. Received payloads below minPooledPayload are plain allocations:
// they wait in stream queues, and credit counts contents plus a 16-byte
// overhead, so a tiny SSE chunk in a pooled buffer would pin many times what
// credit allows. Encoded frames (getFrameBuf) live only until the writer
// has copied or written them, so every size is pooled; the same goes for a
// protobuf frame the decoder reads whole before unmarshalling it and for the
// writer's batch buffer (pooledFrameSize).
const (
	minPooledPayload = 2 << 10
	firstClass       = 512
	numClasses       = 8 // 512 B … 64 KiB
	// classSlack lets a full 32 KiB chunk plus its frame header share one
	// 32 KiB-class buffer instead of taking one of 64 KiB.
	classSlack = 64
)

var payloadPools [numClasses]sync.Pool

// classOf returns the pool class for n bytes, or -1 when n is too large.
func classOf(n int) int {
	for c, size := 0, firstClass; c < numClasses; c, size = c+1, size*2 {
		if n <= size+classSlack {
			return c
		}
	}
	return -1
}

// getPayload returns a buffer of length n for a received payload and, when
// it came from a pool, the handle to give back to putPayload.
func getPayload(n int) ([]byte, *[]byte) {
	if n < minPooledPayload {
		return make([]byte, n), nil
	}
	return getFrameBuf(n)
}

// getFrameBuf returns a pooled buffer of length n (unless n exceeds the
// largest class) for a frame that lives briefly.
func getFrameBuf(n int) ([]byte, *[]byte) {
	c := classOf(n)
	if c < 0 {
		return make([]byte, n), nil
	}
	if p, ok := payloadPools[c].Get().(*[]byte); ok {
		return (*p)[:n], p
	}
	b := make([]byte, (firstClass<<c)+classSlack)
	return b[:n], &b
}

// putPayload returns a buffer from getPayload to its pool; nil is ignored.
// The caller must not touch the buffer afterwards.
func putPayload(p *[]byte) {
	if p == nil {
		return
	}
	if c := classOf(cap(*p)); c >= 0 && cap(*p) == (firstClass<<c)+classSlack {
		*p = (*p)[:cap(*p)]
		payloadPools[c].Put(p)
	}
}
