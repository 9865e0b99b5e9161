//go:build !linux

package procguard

// Protect does nothing outside Linux, which is the only system it knows how
// to protect: on macOS and the BSDs a process of the same user can still
// read the node's environment (ps -E, procstat -e). docs/security.md says so.
func Protect() error { return nil }
