package chattail

import "testing"

func TestCut(t *testing.T) {
	type msg struct {
		role string
		size int
	}
	// seq i+1 is msgs[i]; the walker sees them newest first.
	cut := func(max int, msgs ...msg) int64 {
		w := New(max)
		for i := len(msgs) - 1; i >= 0; i-- {
			if !w.Step(int64(i+1), msgs[i].role, msgs[i].size) {
				break
			}
		}
		return w.Cut(1)
	}
	u, a, tl := func(n int) msg { return msg{"user", n} }, func(n int) msg { return msg{"assistant", n} }, func(n int) msg { return msg{"tool", n} }
	cases := []struct {
		name string
		max  int
		msgs []msg
		want int64
	}{
		{"all fit", 100, []msg{u(10), a(10), u(10), a(10)}, 1},
		{"oldest turn dropped", 35, []msg{u(10), a(10), u(10), a(10)}, 3},
		{"a turn with tool messages goes whole", 45, []msg{u(10), a(10), tl(10), a(10), u(10), a(10)}, 5},
		{"the latest turn stays even past the bound", 5, []msg{u(10), a(10), u(10), a(10)}, 3},
		{"no user message: everything", 5, []msg{a(10), a(10)}, 1},
		{"a prefix before the first user message fits", 100, []msg{a(10), u(10), a(10)}, 1},
		{"a prefix before the first user message does not", 25, []msg{a(10), u(10), a(10)}, 2},
	}
	for _, c := range cases {
		if got := cut(c.max, c.msgs...); got != c.want {
			t.Errorf("%s: cut %d, want %d", c.name, got, c.want)
		}
	}
}
