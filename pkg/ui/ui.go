// Package ui serves tether's operator dashboard: static assets built from web/ (Vite; `make
// ui`) into dist/ and embedded in the binary, so nothing is fetched at run time. The page
// itself holds no data: it reads /v1/status/stream, /v1/services/{service}/sessions and the
// instance actions of the API with the token the user types (kept in sessionStorage and sent
// as an Authorization header, never in a URL), so the assets are served without auth.
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed dist
var dist embed.FS

// Prefix is where the dashboard is mounted.
const Prefix = "/ui/"

// Handler serves the dashboard under Prefix. Hashed assets are cached for a year; index.html
// is revalidated. A Content-Security-Policy limits the page to its own origin.
func Handler() http.Handler {
	sub, err := fs.Sub(dist, "dist")
	if err != nil {
		panic(err) // dist is embedded at build time; a missing directory fails the build first
	}
	files := http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if strings.HasPrefix(r.URL.Path, Prefix+"assets/") {
			h.Set("Cache-Control", "public, max-age=31536000, immutable")
		} else {
			h.Set("Cache-Control", "no-cache")
		}
		files.ServeHTTP(w, r)
	})
}
