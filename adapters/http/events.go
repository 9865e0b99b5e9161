package httpapi

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"iop/domain"
)

// eventBuffer is each event feed subscriber's buffer on the bus, and
// eventBufferBytes its bound in bytes (eventbus.Weight): a run event holds
// up to 16 KiB of text or 32 KiB of metadata, so 1,024 of them buffered
// for a stalled feed held up to 32 MiB alive until its write deadline
// ended it, half a GiB for one key's 16 feeds. A feed over the bound loses
// events as over eventBuffer (": dropped N events").
const (
	eventBuffer      = 1024
	eventBufferBytes = 2 << 20
)

// Caps on live event feeds (Server.MaxSubscriptions,
// MaxSubscriptionsPerKey): each holds a buffer of up to eventBuffer events
// and eventBufferBytes, and costs the edge the filtering and JSON encoding
// of every event it is sent, so 2,048 feeds of one read key made every run
// cost the edge 72 times its CPU. 16 per key leaves room for a console
// open in many tabs and a few tools; a keyless edge counts per client
// address instead.
const (
	DefaultMaxSubscriptions       = 1024
	DefaultMaxSubscriptionsPerKey = 16
)

// feedCaps counts live event feeds, in total and per key.
type feedCaps struct {
	mu    sync.Mutex
	total int
	per   map[string]int
}

// acquire takes a place for a feed of key, or says why there is none.
func (c *feedCaps) acquire(key feedOwner, total, perKey int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.total >= total:
		return domain.Errorf(domain.CodeTooManySubscriptions,
			"the edge already serves %d event feeds, its limit; retry once one has ended", total)
	case c.per[key.id] >= perKey:
		return domain.Errorf(domain.CodeTooManySubscriptions,
			"%s already holds %d event feeds, the limit per %s; close one (a console tab, a tool) first", key.id, perKey, key.kind)
	}
	if c.per == nil {
		c.per = map[string]int{}
	}
	c.total++
	c.per[key.id]++
	return nil
}

func (c *feedCaps) release(key feedOwner) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total--
	if c.per[key.id]--; c.per[key.id] <= 0 {
		delete(c.per, key.id)
	}
}

// feedOwner is whom a feed is counted against: id names it (`API key "ci"`,
// `address 10.0.0.7`) and kind says which of the two caps applies, so the
// refusal names the cap the caller hit.
type feedOwner struct{ id, kind string }

// feedKey is whom a feed is counted against: its key, or on a keyless edge
// its client's network (remoteHost).
func feedKey(r *http.Request) feedOwner {
	if p := domain.PrincipalFrom(r.Context()); p.Name != "" && p.Name != domain.AnonymousName {
		return feedOwner{fmt.Sprintf("API key %q", p.Name), "key"}
	}
	return feedOwner{"address " + remoteHost(r), "client address"}
}

// handleEvents streams the event bus as SSE: one event per bus event, named
// by its type, with the bus event as JSON data, after a first comment
// (": subscribed") sent as soon as the subscription exists. ?type=a,b (or repeated type
// parameters) keeps only those types; a trailing "*" matches a prefix
// ("node.*"); more than maxTypeFilters distinct entries are 400
// invalid_request. A client that falls more than eventBuffer events (or
// eventBufferBytes) behind loses events (the bus never waits for it): the
// stream then carries a comment ": dropped N events" and simply
// continues. The stream ends when the
// client leaves or the server stops. Over the feed caps (feedCaps) it is
// 429 too_many_subscriptions. HEAD gets the stream's headers and ends.
func (s *Server) handleEvents(w http.ResponseWriter, r *http.Request) {
	filter, err := typeFilter(r.URL.Query()["type"])
	if err != nil {
		writeError(w, err)
		return
	}
	key := feedKey(r)
	if err := s.feeds.acquire(key, orDefault(s.MaxSubscriptions, DefaultMaxSubscriptions),
		orDefault(s.MaxSubscriptionsPerKey, DefaultMaxSubscriptionsPerKey)); err != nil {
		writeError(w, err)
		return
	}
	defer s.feeds.release(key)
	if r.Method == http.MethodHead {
		// A HEAD answer has no body: the stream's headers, then the
		// answer ends. Streamed, it never ended (net/http discards what a
		// HEAD handler writes, write deadline included), holding a feed
		// and a bus subscription, and the client's next request on the
		// connection waited forever behind it.
		h := w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		return
	}
	sub := s.deps.Events.SubscribeBytes(eventBuffer, eventBufferBytes, visibleTo(domain.PrincipalFrom(r.Context()), filter))
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
			err := reportDrops()
			if err == nil {
				err = sse.eventJSON(ev.Type, toBusEventJSON(ev))
			}
			sub.Taken(ev)
			if err != nil {
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

// maxTypeFilters bounds the distinct types and prefixes of one event
// subscription. Its filter runs inside Publish with the bus locked, once per
// subscriber for every event of the edge: an unbounded list from the query
// (a megabyte of "zz*" is 240,000 prefixes) made each run event of every
// caller wait on it. The bus has eight types; 32 leaves room for new ones.
const maxTypeFilters = 32

// typeFilter builds a bus filter from type parameters; nil keeps everything.
// More than maxTypeFilters distinct entries are invalid_request, and so is an
// entry with a control character or invalid UTF-8 (domain.CheckID), and an
// entry that names no type the bus carries (domain.BusTypes): a misspelt
// type ("node.registerd"), a family without its "*" ("node"), a "*" that is
// not last ("*.completed") each subscribed to nothing, silently, and the
// caller waited for events that never came.
func typeFilter(params []string) (func(domain.BusEvent) bool, error) {
	exact := map[string]bool{}
	prefix := map[string]bool{}
	for _, p := range params {
		for t := range strings.SplitSeq(p, ",") {
			t = strings.TrimSpace(t)
			if err := domain.CheckID("type", t); err != nil {
				return nil, err
			}
			switch {
			case t == "":
			case strings.HasSuffix(t, "*"):
				pre := strings.TrimSuffix(t, "*")
				if !slices.ContainsFunc(domain.BusTypes, func(bt string) bool { return strings.HasPrefix(bt, pre) }) {
					return nil, unknownType(t)
				}
				prefix[pre] = true
			default:
				if !slices.Contains(domain.BusTypes, t) {
					return nil, unknownType(t)
				}
				exact[t] = true
			}
			if len(exact)+len(prefix) > maxTypeFilters {
				return nil, domain.Errorf(domain.CodeInvalidRequest, "type lists more than %d event types and prefixes", maxTypeFilters)
			}
		}
	}
	if len(exact) == 0 && len(prefix) == 0 {
		return nil, nil
	}
	prefixes := slices.Sorted(maps.Keys(prefix))
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
	}, nil
}

// unknownType is the error for a type entry that matches no bus event.
func unknownType(t string) error {
	return domain.Errorf(domain.CodeInvalidRequest,
		"type %q matches no event type; the types are %s, and a trailing \"*\" matches a prefix (\"node.*\")",
		t, strings.Join(domain.BusTypes, ", "))
}

func orDefault(v, def int) int {
	if v <= 0 {
		return def
	}
	return v
}
