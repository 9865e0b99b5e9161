// Package sqltext fits strings for the stores' text columns.
package sqltext

import "strings"

// NoNUL is s with every NUL byte replaced by U+FFFD. bun writes a value
// into the statement's text, where SQLite's parser cannot take a NUL
// ("unrecognized token"), and PostgreSQL refuses one in text: a value
// holding one failed its whole statement.
func NoNUL(s string) string {
	if strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
