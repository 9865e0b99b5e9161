package chattail

import "testing"

func TestCut(t *testing.T) {
	type msg struct {
		role string
		size int
	}
	// seq i+1 is msgs[i]; the walker sees them newest first.
	cut := func(max int, msgs ...msg) Tail {
		w := New(max)
		for i := len(msgs) - 1; i >= 0; i-- {
			if !w.Step(int64(i+1), msgs[i].role, msgs[i].size) {
				break
			}
		}
		return w.Cut(1)
	}
	u, a, tl := func(n int) msg { return msg{"user", n} }, func(n int) msg { return msg{"assistant", n} }, func(n int) msg { return msg{"tool", n} }
	from := func(seq int64) Tail { return Tail{seq, seq, seq} }
	cases := []struct {
		name string
		max  int
		msgs []msg
		want Tail
	}{
		{"all fit", 100, []msg{u(10), a(10), u(10), a(10)}, from(1)},
		{"oldest turn dropped", 35, []msg{u(10), a(10), u(10), a(10)}, from(3)},
		{"a turn with tool messages goes whole", 45, []msg{u(10), a(10), tl(10), a(10), u(10), a(10)}, from(5)},
		{"the latest turn stays even past the bound", 5, []msg{u(10), a(10), u(10), a(10)}, from(3)},
		{"no user message: everything", 5, []msg{a(10), a(10)}, from(1)},
		{"a prefix before the first user message fits", 100, []msg{a(10), u(10), a(10)}, from(1)},
		{"a prefix before the first user message does not", 25, []msg{a(10), u(10), a(10)}, from(2)},
		// A tool loop: the latest turn's opening and newest groups.
		{"a tool loop within the bound", 100, []msg{u(10), a(10), tl(10), a(10), tl(10), a(10)}, from(1)},
		{"a tool loop keeps its opening and the groups that fit with it", 45,
			[]msg{u(10), a(10), tl(10), a(10), tl(10), a(10)}, Tail{1, 2, 4}},
		{"the newest group stays past the bound", 5,
			[]msg{u(10), a(10), tl(10), a(10), tl(10), a(10)}, Tail{1, 2, 6}},
		{"the opening runs to the first assistant message", 55,
			[]msg{u(10), tl(10), a(10), tl(10), a(10), tl(10), a(10)}, Tail{1, 3, 5}},
		{"parallel calls go with their call", 45,
			[]msg{u(10), a(10), tl(10), tl(10), a(10), tl(10), tl(10), a(5)}, Tail{1, 2, 5}},
		{"an older turn goes first, then groups", 45,
			[]msg{u(10), a(10), u(10), a(10), tl(10), a(10), tl(10), a(10)}, Tail{3, 4, 6}},
		{"one group only: the latest turn whole", 5, []msg{u(10), a(10), tl(10)}, from(1)},
		{"no group: the latest turn whole", 5, []msg{u(10), u(10), tl(10)}, from(2)},
	}
	for _, c := range cases {
		if got := cut(c.max, c.msgs...); got != c.want {
			t.Errorf("%s: cut %+v, want %+v", c.name, got, c.want)
		}
	}
}
