// Package console serves the edge's web console: static HTML, CSS and
// JavaScript embedded in the binary and served under /ui/. The page is only a
// client of the edge's public HTTP API (/v1/…); this package adds no data
// endpoint of its own, so whatever protects the API protects the console's
// data too.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Prefix is where the console is mounted.
const Prefix = "/ui/"

// contentSecurityPolicy allows the page to load only its own files and to
// talk only to its own origin: no inline script, no external fonts, scripts
// or images, no framing.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Handler serves the console's files for GET and HEAD requests under Prefix;
// a request for the bare "/ui" is redirected to Prefix.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic("console: embedded assets missing: " + err.Error())
	}
	files := http.StripPrefix(Prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ui" {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		// The assets change with the binary; revalidate rather than cache.
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
