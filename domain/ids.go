package domain

import (
	"unicode"
	"unicode/utf8"
)

// MaxIDLength bounds an id or a name that callers pass in (run, session and
// node ids, adapter and target names), in bytes.
const MaxIDLength = 256

// CheckID refuses an id a caller sent that cannot be stored, logged or
// echoed safely: one with control characters (NUL included), invalid UTF-8,
// or more than MaxIDLength bytes. The error is invalid_request and names
// field. An empty id passes; required fields are checked by their owners.
func CheckID(field, id string) error {
	if len(id) > MaxIDLength {
		return Errorf(CodeInvalidRequest, "%s is too long: %d bytes, at most %d", field, len(id), MaxIDLength)
	}
	if !utf8.ValidString(id) {
		return Errorf(CodeInvalidRequest, "%s is not valid UTF-8", field)
	}
	for i, r := range id {
		if unicode.IsControl(r) {
			return Errorf(CodeInvalidRequest, "%s has a control character (%U) at byte %d", field, r, i)
		}
	}
	return nil
}

// CheckPathID is CheckID for an id the API also names in a URL path: a run,
// session or node id. It refuses "." and ".." as well: clients and servers
// resolve them as relative path segments, so such an id could be used where
// it travels in a body or a query (a run's session_id "..") but never named
// in a path (DELETE /v1/sessions/.. reached no route).
func CheckPathID(field, id string) error {
	if id == "." || id == ".." {
		return Errorf(CodeInvalidRequest, "%s %q is not allowed: it is a relative path segment", field, id)
	}
	return CheckID(field, id)
}

// CheckPathIDs applies CheckPathID to field/id pairs in order and returns
// the first failure.
func CheckPathIDs(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := CheckPathID(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}

// CheckIDs applies CheckID to field/id pairs in order and returns the first
// failure.
func CheckIDs(pairs ...string) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if err := CheckID(pairs[i], pairs[i+1]); err != nil {
			return err
		}
	}
	return nil
}
