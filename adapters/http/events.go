package httpapi

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"iop/domain"
)

// eventBuffer is each event feed subscriber's buffer on the bus.
const eventBuffer = 1024

// handleEvents streams the event bus as SSE: one event per bus event, named
// by its type, with the bus event as JSON data, after a first comment
// (": subscribed") sent as soon as the subscription exists. ?type=a,b (or repeated type
// parameters) keeps only those types; a trailing "*" matches a prefix
// ("node.*"). A client that falls more than eventBuffer events behind loses
// events (the bus never waits for it): the stream then carries a comment
// ": dropped N events" and simply continues. The stream ends when the
// client leaves or the server stops.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	sub := s.deps.Events.Subscribe(eventBuffer, visibleTo(domain.PrincipalFrom(r.Context()), typeFilter(r.URL.Query()["type"])))
	defer sub.Close()
	ctx, cancel := s.streamContext(r)
	defer cancel()
	sse, err := s.startSSE(w, nil)
	if err != nil {
		return
	}
	// A first comment at once: some clients (Firefox's fetch) report the
	// stream open only when its first body bytes arrive, and the bus may be
	// quiet for a long time.
	if sse.comment("subscribed") != nil {
		return
	}
	tick := time.NewTicker(s.keepAlive())
	defer tick.Stop()
	var reported uint64
	reportDrops := func() error {
		if d := sub.Dropped(); d > reported {
			n := d - reported
			reported = d
			return sse.comment(fmt.Sprintf("dropped %d events", n))
		}
		return nil
	}
	for {
		select {
		case ev, ok := <-sub.C():
			if !ok {
				return
			}
			if reportDrops() != nil || sse.eventJSON(ev.Type, toBusEventJSON(ev)) != nil {
				return
			}
		case <-tick.C:
			if reportDrops() != nil || sse.keepAlive() != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// visibleTo limits filter to the events of nodes caller may see; a caller
// limited to some nodes sees no edge-wide events.
func visibleTo(caller domain.Principal, filter func(domain.BusEvent) bool) func(domain.BusEvent) bool {
	if !caller.Limited() {
		return filter
	}
	return func(ev domain.BusEvent) bool {
		return ev.Node != "" && caller.SeesNode(ev.Node) && (filter == nil || filter(ev))
	}
}

// typeFilter builds a bus filter from type parameters; nil keeps everything.
func typeFilter(params []string) func(domain.BusEvent) bool {
	exact := map[string]bool{}
	var prefixes []string
	for _, p := range params {
		for t := range strings.SplitSeq(p, ",") {
			switch t = strings.TrimSpace(t); {
			case t == "":
			case strings.HasSuffix(t, "*"):
				prefixes = append(prefixes, strings.TrimSuffix(t, "*"))
			default:
				exact[t] = true
			}
		}
	}
	if len(exact) == 0 && len(prefixes) == 0 {
		return nil
	}
	return func(ev domain.BusEvent) bool {
		if exact[ev.Type] {
			return true
		}
		for _, p := range prefixes {
			if strings.HasPrefix(ev.Type, p) {
				return true
			}
		}
		return false
	}
}
