package transport

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"iop/domain"
)

// Config tunes one side of the node link. Zero fields take DefaultConfig's values.
type Config struct {
	// TLS secures the link (tls.go): NewServerTLS for the edge, NewClientTLS
	// for a node. Nil is plaintext. The TLS handshake counts against
	// HandshakeTimeout.
	TLS *tls.Config
	// HeartbeatInterval is how often each side sends a heartbeat.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long a peer may stay silent before the link is
	// dropped. Any frame counts as a sign of life.
	HeartbeatTimeout time.Duration
	// MaxFrameSize bounds every frame read or written.
	MaxFrameSize int
	// StreamWindow is the receive window granted to the peer per stream, in
	// bytes. A stream never queues more than this on the receiving side.
	StreamWindow uint32
	// MaxStreams bounds the streams the peer may have open at once; with
	// StreamWindow it bounds the memory one connection can pin.
	MaxStreams int
	// ControlQueue bounds the queue of control frames waiting for the writer.
	ControlQueue int
	// NoDataFrames keeps tunnel bodies in protobuf frames even when the
	// peer reads binary data frames: what a node or edge of an older
	// version does. For compatibility tests and comparisons only.
	NoDataFrames bool
	// WriteTimeout catches half-open peers on send.
	WriteTimeout time.Duration
	// HandshakeTimeout bounds the register exchange, from accept to the
	// answer, including any wait for a handshake slot.
	HandshakeTimeout time.Duration
	// MaxPending bounds the connections that have not registered yet;
	// MaxPendingPerAddr bounds them per network prefix (an IPv4 address, an
	// IPv6 /64). Past MaxPendingPerAddr a new connection is closed at once;
	// at MaxPending it takes the place of another prefix's waiting
	// connection, or is closed at once (admission).
	MaxPending        int
	MaxPendingPerAddr int
	// RegisterFailBurst and RegisterFailRate (per second) are the token
	// bucket of failed registrations (unknown token, garbage first frame;
	// not what a browser sends: foreign.go) allowed per network prefix; past it
	// the edge closes without answering.
	RegisterFailBurst int
	RegisterFailRate  float64
	Logger            *slog.Logger

	// writerLinger is how long a link's writer with nothing to write waits
	// for more before it ends (conn.go); tests shorten it. writerStays
	// keeps the writer for the link's life, as before writers ran on
	// demand: a baseline for benchmarks.
	writerLinger time.Duration
	writerStays  bool
	// closeGrace bounds CloseAfterFlush (conn.go); tests shorten it.
	closeGrace time.Duration
	// commandResultLimit bounds the command result an edge collects from
	// a node (link.go); zero is commandResultMax. Tests lower it.
	commandResultLimit int
	// noRawHeaders makes this side neither ask for nor agree to
	// raw_header_values, as a version before it did: compatibility tests.
	noRawHeaders bool
}

// DefaultConfig returns the spec's settings: 30 s heartbeat, 45 s wait, 4 MiB frames.
func DefaultConfig() Config {
	return Config{
		HeartbeatInterval: 30 * time.Second,
		HeartbeatTimeout:  45 * time.Second,
		MaxFrameSize:      DefaultMaxFrameSize,
		StreamWindow:      256 << 10,
		MaxStreams:        512,
		ControlQueue:      64,
		WriteTimeout:      45 * time.Second,
		HandshakeTimeout:  10 * time.Second,
		MaxPending:        4096,
		MaxPendingPerAddr: 512,
		RegisterFailBurst: 10,
		RegisterFailRate:  1,
	}
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = d.HeartbeatInterval
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = d.HeartbeatTimeout
	}
	if c.MaxFrameSize <= 0 {
		c.MaxFrameSize = d.MaxFrameSize
	}
	if c.StreamWindow == 0 {
		c.StreamWindow = d.StreamWindow
	}
	if c.MaxStreams <= 0 {
		c.MaxStreams = d.MaxStreams
	}
	if c.ControlQueue <= 0 {
		c.ControlQueue = d.ControlQueue
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = c.HeartbeatTimeout
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = d.HandshakeTimeout
	}
	if c.MaxPending <= 0 {
		c.MaxPending = d.MaxPending
	}
	if c.MaxPendingPerAddr <= 0 {
		c.MaxPendingPerAddr = d.MaxPendingPerAddr
	}
	if c.RegisterFailBurst <= 0 {
		c.RegisterFailBurst = d.RegisterFailBurst
	}
	if c.RegisterFailRate <= 0 {
		c.RegisterFailRate = d.RegisterFailRate
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.writerLinger <= 0 {
		c.writerLinger = writerLinger
	}
	if c.closeGrace <= 0 {
		c.closeGrace = closeGrace
	}
	if c.commandResultLimit <= 0 {
		c.commandResultLimit = max(MaxCommandResult, 4*c.MaxFrameSize)
	}
	return c
}

// Verify reports settings that cannot work together.
func (c Config) Verify() error {
	c = c.withDefaults()
	var errs []error
	if c.HeartbeatTimeout <= c.HeartbeatInterval {
		errs = append(errs, fmt.Errorf("heartbeat timeout %v must exceed interval %v", c.HeartbeatTimeout, c.HeartbeatInterval))
	}
	errs = append(errs, heartbeatRangeErrs(c.HeartbeatInterval, c.HeartbeatTimeout)...)
	if c.MaxFrameSize < 64<<10 {
		errs = append(errs, fmt.Errorf("max frame size %d is below 64 KiB", c.MaxFrameSize))
	}
	if c.StreamWindow < MinStreamWindow {
		errs = append(errs, fmt.Errorf("stream window %d is below %d", c.StreamWindow, MinStreamWindow))
	}
	return errors.Join(errs...)
}

// heartbeatRangeErrs reports a heartbeat interval or timeout outside
// [MinHeartbeat, MaxHeartbeat]: what the edge may send and a node accepts.
func heartbeatRangeErrs(interval, timeout time.Duration) []error {
	var errs []error
	for _, d := range []struct {
		what string
		v    time.Duration
	}{{"interval", interval}, {"timeout", timeout}} {
		if d.v < MinHeartbeat || d.v > MaxHeartbeat {
			errs = append(errs, fmt.Errorf("heartbeat %s %v is outside [%v, %v]", d.what, d.v, MinHeartbeat, MaxHeartbeat))
		}
	}
	return errs
}

// windowTooSmall is the error for a receive window a peer announced below
// MinStreamWindow (0 means the other side's own, so it is fine).
func windowTooSmall(w uint32) error {
	if w != 0 && w < MinStreamWindow {
		return fmt.Errorf("initial_window %d is below the minimum of %d bytes", w, MinStreamWindow)
	}
	return nil
}

// MaxCommandResult is the most of one command's result (its result_json
// chunks together) an edge collects from a node (link.go), unless four
// frames of max_frame_size are more. A node sending more (a bug, or a
// hostile node answering run_get or runs, which the edge issues on its
// own) would otherwise have the edge buffer all of it: past the limit the
// edge resets the stream (code result_too_large) and the command fails
// with result_too_large.
const MaxCommandResult = 16 << 20

// maxDataChunk is the largest body slice put in one data frame, so no stream
// hogs the socket and every data frame fits in a quarter window.
const maxDataChunk = 32 << 10

// maxChunkCost is what a full data chunk costs against credit: the chunk,
// its frame's protobuf fields and frameOverhead. Stream.Send refuses frames
// over a quarter window, so the window must be at least four of these.
const maxChunkCost = maxDataChunk + 256

// Bounds of the heartbeat interval and timeout (domain.MinHeartbeat).
const (
	MinHeartbeat = domain.MinHeartbeat
	MaxHeartbeat = domain.MaxHeartbeat
)

// MinStreamWindow is the smallest receive window a side may grant: four
// full data chunks. Each end refuses a peer that announces a smaller one
// (the edge refuses the registration, the node the edge), since nothing
// larger than a quarter of it could be sent: a tunnel's request body would
// stall after its first piece.
const MinStreamWindow = 4 * maxChunkCost
