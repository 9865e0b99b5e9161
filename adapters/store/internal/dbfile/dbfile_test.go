package dbfile

import "testing"

func TestPath(t *testing.T) {
	for dsn, want := range map[string]string{
		"":                                   "",
		"iop.db":                             "iop.db",
		"/var/lib/iop/edge.db":               "/var/lib/iop/edge.db",
		"node.db?_pragma=foreign_keys(1)":    "node.db",
		"file:iop.db?cache=shared&mode=rwc":  "iop.db",
		"file:/srv/a%20b.db?mode=rwc":        "/srv/a b.db",
		"file:///srv/iop.db":                 "/srv/iop.db",
		"file://localhost/srv/iop.db?x=1":    "/srv/iop.db",
		"file:iop.db#frag":                   "iop.db",
		"file::memory:?cache=shared":         "",
		":memory:":                           "",
		"file:mem1?mode=memory&cache=shared": "",
		"file://otherhost/srv/iop.db":        "",
	} {
		if got := Path(dsn); got != want {
			t.Errorf("Path(%q) = %q, want %q", dsn, got, want)
		}
	}
}

func TestMayCreate(t *testing.T) {
	for dsn, want := range map[string]bool{
		"iop.db":                   true,
		"file:iop.db":              true,
		"file:iop.db?mode=rwc":     true,
		"file:iop.db?mode=ro":      false,
		"file:iop.db?mode=rw#x":    false,
		"file:iop.db?cache=shared": true,
	} {
		if got := mayCreate(dsn); got != want {
			t.Errorf("mayCreate(%q) = %v, want %v", dsn, got, want)
		}
	}
}
