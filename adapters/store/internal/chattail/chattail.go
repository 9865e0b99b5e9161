// Package chattail finds the replayable tail of a chat session, for the
// stores' ports.ChatSessionStore.LoadChat bound: walking a session's
// messages newest first, it keeps whole turns (a turn starts at a user
// message) while their sizes sum to at most the bound, and always the
// latest turn — of which, when it alone is past the bound (an agent's tool
// loop: one user message, then many tool calls and results), its opening
// (its user message, up to its first assistant message) and its newest
// tool-call groups (each from an assistant message up to the next) that fit
// with it, at least the newest. The leading system/developer messages are
// the stores' to add. It keeps at least what the runtime's trim of the whole
// history replays (see adapters/runtime/internal/chat).
package chattail

// Head reports whether a message with role belongs to a session's leading
// instructions, which a bounded load always returns.
func Head(role string) bool { return role == "system" || role == "developer" }

// Tail is where the messages of a bounded load after its head are: from
// From on, and before them, when the latest turn is cut inside, its opening
// [Open, OpenEnd). Without such a cut Open and OpenEnd are From.
type Tail struct{ Open, OpenEnd, From int64 }

// Whole reports whether the tail is a single run of messages.
func (t Tail) Whole() bool { return t.Open == t.OpenEnd }

// group is an assistant message of the latest turn: where a cut inside it
// may fall, and the size of the messages from it to the newest.
type group struct {
	seq  int64
	size int
}

// Walker is fed a session's messages after its head, newest first.
type Walker struct {
	max    int
	total  int
	tail   Tail
	latest bool // the latest turn's start was seen
	done   bool
	// The latest turn's assistant messages seen so far, newest first:
	// those whose groups fit in max (and the newest), and the oldest.
	groups []group
	oldest group
}

// New returns a walker bounded at max bytes.
func New(max int) *Walker { return &Walker{max: max, tail: Tail{-1, -1, -1}} }

// Step takes the next older message (its sequence number, role and size)
// and reports whether the walk needs more.
func (w *Walker) Step(seq int64, role string, size int) bool {
	if w.done {
		return false
	}
	w.total += size
	if w.latest {
		if role == "user" {
			if w.total > w.max {
				w.done = true
				return false
			}
			w.tail = Tail{seq, seq, seq}
		}
		return true
	}
	switch role {
	case "assistant":
		g := group{seq, w.total}
		if len(w.groups) == 0 || g.size <= w.max {
			w.groups = append(w.groups, g)
		}
		w.oldest = g
	case "user":
		w.latest, w.tail = true, Tail{seq, seq, seq}
		if w.total <= w.max {
			return true
		}
		// The latest turn alone is past the bound: nothing older is kept,
		// and of it, its opening and its newest groups that fit with it.
		w.done = true
		if len(w.groups) > 0 {
			open := w.total - w.oldest.size
			pick := w.groups[0]
			for _, g := range w.groups[1:] {
				if open+g.size > w.max {
					break
				}
				pick = g
			}
			if pick.seq != w.oldest.seq {
				w.tail = Tail{seq, w.oldest.seq, pick.seq}
			}
		}
		w.groups = nil
		return false
	}
	return true
}

// Cut returns the tail, given first, the oldest message after the head: a
// walk that reached it within the bound (or found no user message) keeps
// everything from it.
func (w *Walker) Cut(first int64) Tail {
	if !w.done && (w.total <= w.max || !w.latest) {
		return Tail{first, first, first}
	}
	return w.tail
}

// Size is a stored message's size as a turn replays it: its JSON, or for a
// message stored without it, its role and text in the JSON object they
// replay as (at least; escapes only add, so a bounded load keeps at least
// what the replay keeps).
func Size(role, content, raw string) int {
	if raw != "" {
		return len(raw)
	}
	return len(`{"role":"","content":""}`) + len(role) + len(content)
}
