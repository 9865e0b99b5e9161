// Package agenttest checks a CLI agent Parser against arbitrary output.
package agenttest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"iop/adapters/runtime/internal/agent"
	"iop/adapters/runtime/internal/lines"
	"iop/domain"
)

// recorder is an EventSink that keeps events, for FeedLines.
type recorder struct{ events []domain.RunEvent }

func (r *recorder) Emit(ev domain.RunEvent) error {
	r.events = append(r.events, ev)
	return nil
}

// FeedLines runs p over out, a CLI's whole stdout, as Execute does (lines
// as lines.Reader splits them, then End with no process state), and
// checks what a fuzz target asks of any output: no line fails the run
// (the sink never does and there is no session store), every metadata
// event is valid JSON, and End is a complete or error event. It returns
// the first violation, or nil.
func FeedLines(p agent.Parser, model string, out []byte) error {
	rec := &recorder{}
	t := agent.NewTurn(context.Background(), rec, model)
	lr := lines.NewReader(bytes.NewReader(out), 0)
	for {
		line, err := lr.Next()
		if err != nil {
			break
		}
		if err := p.Line(t, line); err != nil {
			return fmt.Errorf("line %q: %w", line, err)
		}
	}
	end := p.End(t, nil, "")
	for _, ev := range append(rec.events, end) {
		if ev.Type == domain.EventMetadata && !json.Valid(ev.Metadata) {
			return fmt.Errorf("metadata is not JSON: %q", ev.Metadata)
		}
	}
	if end.Type != domain.EventComplete && (end.Type != domain.EventError || end.Error == nil) {
		return fmt.Errorf("terminal event %+v", end)
	}
	return nil
}
