// Package runlimit applies an adapter's configured run timeout and tells a
// timeout apart from the caller's cancellation: the first becomes an error
// event with code timeout, the second a plain return of ctx.Err() (the run
// manager then emits cancelled).
package runlimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"iop/domain"
	"iop/ports"
)

var errExpired = errors.New("run timeout expired")

// Limit is a run's context with an optional deadline.
type Limit struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
	d      time.Duration
}

// New limits ctx to d; d <= 0 means no limit. Call Stop when the run ends.
func New(ctx context.Context, d time.Duration) *Limit {
	l := &Limit{parent: ctx, d: d}
	if d > 0 {
		l.ctx, l.cancel = context.WithTimeoutCause(ctx, d, errExpired)
	} else {
		l.ctx, l.cancel = context.WithCancel(ctx)
	}
	return l
}

// Context is the context the run's work should use.
func (l *Limit) Context() context.Context { return l.ctx }

// Stop releases the timer.
func (l *Limit) Stop() { l.cancel() }

// Expired reports whether the run ended because its timeout expired rather
// than because the caller cancelled it.
func (l *Limit) Expired() bool {
	return l.parent.Err() == nil && errors.Is(context.Cause(l.ctx), errExpired)
}

// Event is the error event for an expired run.
func (l *Limit) Event(what string) domain.RunEvent {
	return domain.RunEvent{Type: domain.EventError, Error: &domain.ErrorInfo{
		Code: domain.CodeTimeout, Message: fmt.Sprintf("%s timed out after %s", what, l.d),
	}}
}

// Fail ends a run that went wrong: it returns the caller's ctx.Err() when the
// caller cancelled (the run manager then reports cancelled), emits the
// timeout event when the run's own limit expired, and otherwise emits an
// error event built from err. what names the work for the timeout message.
func (l *Limit) Fail(sink ports.EventSink, what string, err error) error {
	if perr := l.parent.Err(); perr != nil {
		return perr
	}
	if l.Expired() {
		return sink.Emit(l.Event(what))
	}
	return sink.Emit(domain.ErrorEvent("", err))
}
