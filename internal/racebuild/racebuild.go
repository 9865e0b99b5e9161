// Package racebuild tells whether this binary was built with the race
// detector, for tests that scale their work down under it (it makes each
// step several times slower).
package racebuild

import "runtime/debug"

// Enabled reports whether this binary was built with -race.
func Enabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
