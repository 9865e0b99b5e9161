package domain

import "strings"

// RedactURL returns a base_url (or any URL of a provider) fit to quote in an
// error or a log line: everything between "scheme://" (or the start, when
// there is none) and the last "@" is taken as user and password, and the
// password is replaced by "xxxxx", as url.URL.Redacted does. It works on
// the text, parsed or not: a password may hold "#", "?" or "/", which end
// the authority for a URL parser, so the parsed URL's Redacted would show
// it; a user that holds one of those goes too. Configs quote it with %q.
func RedactURL(s string) string {
	prefix, rest := "", s
	if scheme, after, ok := strings.Cut(s, "://"); ok {
		prefix, rest = scheme+"://", after
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return s
	}
	user, _, hasPassword := strings.Cut(rest[:at], ":")
	switch {
	case strings.ContainsAny(user, "/?#"):
		user = "xxxxx"
	case hasPassword:
		user += ":xxxxx"
	}
	return prefix + user + rest[at:]
}

// RedactBaseURL is RedactURL without a query or fragment, shown as "?…": a
// base_url's query may hold a key (?key=…). RedactURL has already replaced
// a password or user holding "?" or "#".
func RedactBaseURL(s string) string {
	r := RedactURL(s)
	start := 0
	if i := strings.Index(r, "://"); i >= 0 {
		start = i + len("://")
	}
	if i := strings.IndexAny(r[start:], "?#"); i >= 0 {
		return r[:start+i] + "?…"
	}
	return r
}
