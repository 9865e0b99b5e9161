// Package chattail finds where the replayable tail of a chat session starts,
// for the stores' ports.ChatSessionStore.LoadChat bound: walking a session's
// messages newest first, it keeps whole turns (a turn starts at a user
// message) while their sizes sum to at most the bound, and always the latest
// turn. The leading system/developer messages are the stores' to add.
package chattail

// Head reports whether a message with role belongs to a session's leading
// instructions, which a bounded load always returns.
func Head(role string) bool { return role == "system" || role == "developer" }

// Walker is fed a session's messages after its head, newest first.
type Walker struct {
	max    int
	total  int
	cut    int64
	latest bool // the latest turn's start was seen
	done   bool
}

// New returns a walker bounded at max bytes.
func New(max int) *Walker { return &Walker{max: max, cut: -1} }

// Step takes the next older message (its sequence number, role and size)
// and reports whether the walk needs more.
func (w *Walker) Step(seq int64, role string, size int) bool {
	if w.done {
		return false
	}
	w.total += size
	if role == "user" {
		switch {
		case !w.latest:
			w.latest, w.cut = true, seq
		case w.total <= w.max:
			w.cut = seq
		default:
			w.done = true
			return false
		}
	}
	return true
}

// Cut returns the sequence number the tail starts at, given first, the
// oldest message after the head: a walk that reached it within the bound
// (or found no user message) keeps everything from it.
func (w *Walker) Cut(first int64) int64 {
	if !w.done && (w.total <= w.max || !w.latest) {
		return first
	}
	return w.cut
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
