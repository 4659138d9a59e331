package ui_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testutil"
	"github.com/tether-dev/tether/pkg/ui"
)

// TestBuiltAssetsMatchTheirSources: dist/SOURCES.sha256, written by `make ui`, is the hash of
// the sources as they are now (the same file list and framing as web/hash-sources.mjs): a
// source edited without rebuilding fails here.
func TestBuiltAssetsMatchTheirSources(t *testing.T) {
	files := []string{"index.html", "vite.config.js", "package.json", "package-lock.json"}
	entries, err := os.ReadDir("web/src")
	if err != nil {
		t.Fatal(err)
	}
	var src []string
	for _, e := range entries {
		src = append(src, "src/"+e.Name())
	}
	slices.Sort(src)
	h := sha256.New()
	for _, f := range append(files, src...) {
		b, err := os.ReadFile(filepath.Join("web", f))
		if err != nil {
			t.Fatal(err)
		}
		h.Write([]byte(f + "\x00"))
		h.Write(b)
		h.Write([]byte("\x00"))
	}
	want, err := os.ReadFile("dist/SOURCES.sha256")
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != strings.TrimSpace(string(want)) {
		t.Fatalf("dist/ was built from other sources (recorded %s, sources now %s): run make ui and commit pkg/ui/dist", strings.TrimSpace(string(want)), got)
	}
}

// TestHandlerServesTheEmbeddedPage: /ui/ is the page, its script and style load from /ui/assets/
// and nothing is referenced off the origin.
func TestHandlerServesTheEmbeddedPage(t *testing.T) {
	srv := httptest.NewServer(http.StripPrefix("", ui.Handler()))
	defer srv.Close()
	r := testutil.Get(t, srv.URL+"/ui/")
	if r.Status != http.StatusOK || !strings.Contains(r.Body, "<title>tether</title>") {
		t.Fatalf("/ui/: %d %.200s", r.Status, r.Body)
	}
	if strings.Contains(r.Body, "http://") || strings.Contains(r.Body, "https://") {
		t.Errorf("the page references another origin:\n%s", r.Body)
	}
	if csp := r.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
	for _, part := range strings.Split(r.Body, `"`) {
		if strings.HasPrefix(part, "/ui/assets/") {
			a := testutil.Get(t, srv.URL+part)
			if a.Status != http.StatusOK || a.Body == "" || !strings.Contains(a.Header.Get("Cache-Control"), "immutable") {
				t.Errorf("%s: %d, cache %q", part, a.Status, a.Header.Get("Cache-Control"))
			}
		}
	}
}
