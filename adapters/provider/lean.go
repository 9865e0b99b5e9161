package provider

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"iop/adapters/internal/sockpeek"
)

// leanClient is the provider client's HTTP/1.1 path for plain-http
// providers reached without a proxy (a node next to a local vLLM, Ollama or
// llama.cpp). net/http.Transport runs a write goroutine and a read goroutine
// per connection and hands each request and response between them and the
// caller: two goroutine wake-ups per request plus per-body bookkeeping, which
// the node's execution traces showed on the tunnel's path to first byte.
// Here the caller's goroutine writes the request, reads the response headers
// and reads the body itself, with the standard library's request writer and
// response parser (chunked and sized bodies alike), over a bounded pool of
// idle keep-alive connections.
//
// Requests are half-duplex: the whole request is written before the
// response is read, which every LLM API is. https providers and proxied
// URLs keep http.Transport (HTTP/2, TLS, proxies).
type leanClient struct {
	dialer        net.Dialer
	headerTimeout time.Duration
	maxIdle       int // per host:port
	idleTimeout   time.Duration

	mu     sync.Mutex
	idle   map[string][]*leanConn // by host:port, most recently used last
	sweep  *time.Timer            // closes idle connections past idleTimeout
	closed bool
}

// leanConn is one provider connection with its buffers.
type leanConn struct {
	nc       net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	addr     string
	nread    int64     // bytes read from nc, to tell "no response byte yet"
	idleFrom time.Time // when it was last put in the pool
	// headerLeft, while headers are read, is how many more bytes they may
	// take (a provider's endless header line must not grow the parser's
	// buffer without end); noHeaderLimit otherwise.
	headerLeft int64
}

// noHeaderLimit is leanConn.headerLeft outside of response headers.
const noHeaderLimit = -1

// maxResponseHeaderBytes bounds a response's headers (1xx ones included),
// as net/http.Transport's default does. It bounds reading them only: the
// link to the edge carries far fewer in its one header frame, and the
// tunnel answers larger ones with provider_error (application/node).
const maxResponseHeaderBytes = 10 << 20

// errHeaderTooLarge ends an exchange whose response headers pass
// maxResponseHeaderBytes.
var errHeaderTooLarge = fmt.Errorf("provider response headers exceed %d bytes", maxResponseHeaderBytes)

// Read counts what the response parser reads from the connection, and holds
// headers to their bound.
func (c *leanConn) Read(p []byte) (int, error) {
	if c.headerLeft != noHeaderLimit {
		if c.headerLeft == 0 {
			return 0, errHeaderTooLarge
		}
		if int64(len(p)) > c.headerLeft {
			p = p[:c.headerLeft]
		}
	}
	n, err := c.nc.Read(p)
	c.nread += int64(n)
	if c.headerLeft != noHeaderLimit {
		c.headerLeft -= int64(n)
	}
	return n, err
}

func newLeanClient(dialTimeout, headerTimeout time.Duration, maxIdle int, idleTimeout time.Duration) *leanClient {
	return &leanClient{
		dialer:        net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second},
		headerTimeout: headerTimeout,
		maxIdle:       maxIdle,
		idleTimeout:   idleTimeout,
		idle:          map[string][]*leanConn{},
	}
}

// errLeanClosed is returned once the client is closed.
var errLeanClosed = errors.New("provider client closed")

// hostPort is the address to dial for an http:// URL.
func hostPort(u *http.Request) string {
	port := u.URL.Port()
	if port == "" {
		port = "80"
	}
	return net.JoinHostPort(u.URL.Hostname(), port)
}

// do sends hreq and returns its response; the body is read by the caller
// and the connection goes back to the pool when it ends cleanly. newBody,
// when non-nil, returns hreq's body afresh for a retry, or false if part of
// it can no longer be sent again (a streamed body already read from).
//
// A request on a reused connection that the provider had closed (an error
// with not one response byte received) is sent once more on a new
// connection, if its body can be and sending it twice is safe: a provider
// closes an idle connection at any time, and the stale-check before reuse
// cannot see a close that crosses the request on the wire. A request that
// is not replayable (a POST without an idempotency key: a completion the
// provider may have started, billed or half-generated before it dropped
// the connection) is sent again only if writing it failed, which means the
// connection was closed before the provider could have read it whole.
func (l *leanClient) do(ctx context.Context, hreq *http.Request, newBody func() (io.ReadCloser, bool)) (*http.Response, error) {
	addr := hostPort(hreq)
	replay := replayable(hreq)
	if u := hreq.URL.User; u != nil && hreq.Header.Get("Authorization") == "" {
		// Credentials in the base URL, as net/http.Client sends them
		// (Request.Write itself leaves them out).
		pw, _ := u.Password()
		hreq.Header = hreq.Header.Clone()
		hreq.SetBasicAuth(u.Username(), pw)
	}
	for attempt := 0; ; attempt++ {
		c, reused, err := l.get(ctx, addr, attempt > 0)
		if err != nil {
			return nil, err
		}
		// Cancellation closes the connection: that ends a blocked write, a
		// wait for headers or a body read at once.
		stop := context.AfterFunc(ctx, func() { _ = c.nc.Close() })
		mark := c.nread
		resp, keep, wrote, err := l.exchange(c, hreq)
		if err == nil {
			if resp.Body == http.NoBody {
				// Nothing more to read: the connection is free now.
				l.release(c, stop, keep)
				return resp, nil
			}
			resp.Body = &leanBody{l: l, c: c, rc: resp.Body, stop: stop, keep: keep, ctx: ctx}
			return resp, nil
		}
		stop()
		_ = c.nc.Close()
		if !reused || attempt > 0 || c.nread != mark || ctx.Err() != nil || isTimeout(err) || newBody == nil || (wrote && !replay) {
			return nil, err
		}
		body, ok := newBody()
		if !ok {
			return nil, err
		}
		hreq.Body = body
	}
}

// exchange writes hreq on c and reads the response headers. keep reports
// whether c may carry another request once the body is read to its end;
// wrote, whether the whole request was handed to the connection (on an
// error: whether the provider may have read it whole).
func (l *leanClient) exchange(c *leanConn, hreq *http.Request) (resp *http.Response, keep, wrote bool, err error) {
	werr := hreq.Write(c.bw)
	if werr == nil {
		werr = c.bw.Flush()
	}
	if werr != nil {
		// A provider may answer before it has read the whole request (a
		// 413, a 404, a blob it already has) and close: the write then
		// fails, but its answer is there to read, and it is the answer —
		// the request must not be sent again. Without one at hand the
		// write failure ends the exchange, as in http.Transport (the
		// provider may still be waiting for the rest of a streamed body
		// that failed, so a longer wait could take the whole header
		// timeout).
		_ = c.nc.SetReadDeadline(time.Now().Add(earlyAnswerWait))
		if _, err := c.br.Peek(1); err != nil {
			return nil, false, false, werr
		}
		if resp, err = l.readResponse(c, hreq); err != nil {
			return nil, false, false, werr
		}
		_ = c.nc.SetReadDeadline(time.Time{})
		return resp, false, true, nil
	}
	// The header timeout runs from the end of the request, as
	// http.Transport's ResponseHeaderTimeout does.
	_ = c.nc.SetReadDeadline(time.Now().Add(l.headerTimeout))
	if resp, err = l.readResponse(c, hreq); err != nil {
		return nil, false, true, err
	}
	_ = c.nc.SetReadDeadline(time.Time{})
	keep = !resp.Close && !hreq.Close && resp.StatusCode != http.StatusSwitchingProtocols
	return resp, keep, true, nil
}

// earlyAnswerWait is how long a failed write waits for an answer the
// provider sent before it stopped reading; one already sent is in the
// socket's buffer.
const earlyAnswerWait = 100 * time.Millisecond

// readResponse reads the response to hreq, past any 1xx informational
// answers (103 Early Hints), all headers together held to
// maxResponseHeaderBytes. A 101 is returned: it would hand the connection
// over, which a tunnel does not do, so the caller does not keep it.
func (l *leanClient) readResponse(c *leanConn, hreq *http.Request) (*http.Response, error) {
	c.headerLeft = maxResponseHeaderBytes
	defer func() { c.headerLeft = noHeaderLimit }()
	for {
		resp, err := http.ReadResponse(c.br, hreq)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode < 100 || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return resp, nil
		}
	}
}

// replayable reports whether hreq may reach the provider twice without
// harm, by net/http.Transport's rule: an idempotent method, or a request
// that carries an idempotency key (the provider then drops a duplicate).
func replayable(hreq *http.Request) bool {
	switch hreq.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := hreq.Header["Idempotency-Key"]
	_, xkey := hreq.Header["X-Idempotency-Key"]
	return key || xkey
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// get returns an idle connection to addr that the provider has not closed,
// or a new one (always new when fresh is set); reused says which. Every
// reused connection is checked, however briefly idle (one non-blocking
// peek): besides a close, the check catches bytes the provider sent past
// its last response, which would otherwise be read as the next answer.
func (l *leanClient) get(ctx context.Context, addr string, fresh bool) (c *leanConn, reused bool, err error) {
	for !fresh {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, false, errLeanClosed
		}
		list := l.idle[addr]
		if len(list) == 0 {
			l.mu.Unlock()
			break
		}
		c = list[len(list)-1]
		list[len(list)-1] = nil
		l.idle[addr] = list[:len(list)-1]
		l.mu.Unlock()
		if time.Since(c.idleFrom) < l.idleTimeout && !sockpeek.Closed(c.nc) {
			return c, true, nil
		}
		_ = c.nc.Close()
	}
	nc, err := l.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, err
	}
	c = &leanConn{nc: nc, addr: addr, headerLeft: noHeaderLimit}
	c.br = bufio.NewReader(c)
	c.bw = bufio.NewWriter(nc)
	return c, false, nil
}

// release ends c's request: back to the pool when keep holds and the
// request's context did not close it, closed otherwise.
func (l *leanClient) release(c *leanConn, stop func() bool, keep bool) {
	if !stop() || !keep || c.br.Buffered() > 0 {
		// stop false: cancellation closed (or is closing) the connection.
		_ = c.nc.Close()
		return
	}
	c.idleFrom = time.Now()
	l.mu.Lock()
	if l.closed || len(l.idle[c.addr]) >= l.maxIdle {
		l.mu.Unlock()
		_ = c.nc.Close()
		return
	}
	l.idle[c.addr] = append(l.idle[c.addr], c)
	if l.sweep == nil {
		l.sweep = time.AfterFunc(l.idleTimeout, l.closeExpired)
	}
	l.mu.Unlock()
}

// closeExpired closes connections idle for idleTimeout and runs again while
// any stay idle.
func (l *leanClient) closeExpired() {
	var expired []*leanConn
	l.mu.Lock()
	defer func() {
		l.mu.Unlock()
		for _, c := range expired {
			_ = c.nc.Close()
		}
	}()
	l.sweep = nil
	if l.closed {
		return
	}
	now := time.Now()
	var next time.Duration
	for addr, list := range l.idle {
		kept := list[:0]
		for _, c := range list {
			if left := l.idleTimeout - now.Sub(c.idleFrom); left > 0 {
				kept = append(kept, c)
				if next == 0 || left < next {
					next = left
				}
			} else {
				expired = append(expired, c)
			}
		}
		clear(list[len(kept):])
		if len(kept) == 0 {
			delete(l.idle, addr)
		} else {
			l.idle[addr] = kept
		}
	}
	if next > 0 {
		l.sweep = time.AfterFunc(next, l.closeExpired)
	}
}

// Close closes the idle connections; those in use close when their
// request ends.
func (l *leanClient) Close() {
	l.mu.Lock()
	l.closed = true
	if l.sweep != nil {
		l.sweep.Stop()
		l.sweep = nil
	}
	idle := l.idle
	l.idle = map[string][]*leanConn{}
	l.mu.Unlock()
	for _, list := range idle {
		for _, c := range list {
			_ = c.nc.Close()
		}
	}
}

// idleCount is the number of pooled connections to addr (tests).
func (l *leanClient) idleCount(addr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.idle[addr])
}

// leanBody is a response body read in the caller's goroutine. Read to its
// end cleanly, it returns the connection to the pool; closed before that,
// it closes the connection (the rest is never drained: a stream can be
// endless).
type leanBody struct {
	l    *leanClient
	c    *leanConn
	rc   io.ReadCloser
	stop func() bool
	keep bool
	ctx  context.Context

	state atomic.Int32 // 0 reading, 1 released or closed
	eof   bool         // read to its end (Read's goroutine only)
}

func (b *leanBody) Read(p []byte) (int, error) {
	if b.eof {
		return 0, io.EOF
	}
	if b.state.Load() != 0 {
		return 0, errBodyClosed
	}
	n, err := b.rc.Read(p)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF):
		b.eof = true
		if b.state.CompareAndSwap(0, 1) {
			b.l.release(b.c, b.stop, b.keep)
		}
	default:
		if b.state.CompareAndSwap(0, 1) {
			b.stop()
			_ = b.c.nc.Close()
		}
		if b.ctx.Err() != nil {
			// The read failed because cancellation closed the connection.
			err = b.ctx.Err()
		}
	}
	return n, err
}

// errBodyClosed is what a read after Close returns, as net/http's does.
var errBodyClosed = errors.New("http: read on closed response body")

func (b *leanBody) Close() error {
	if b.state.CompareAndSwap(0, 1) {
		b.stop()
		_ = b.c.nc.Close()
	}
	return nil
}
