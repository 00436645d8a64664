package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"chessd/console"
)

// The pages and the bundle: index.html for every page path with the CSP and no-cache,
// hashed assets cacheable for good, revalidation by ETag, nothing else.
func TestHandler(t *testing.T) {
	h := console.New()
	if !h.Built() {
		t.Fatal("the console is not built into console/dist: run `make web`")
	}
	get := func(path string, hdr ...string) *http.Response {
		t.Helper()
		req := httptest.NewRequest("GET", path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Result()
	}
	var index string
	for _, p := range console.Pages {
		res := get(p)
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
			t.Fatalf("GET %s: %d %s", p, res.StatusCode, res.Header.Get("Content-Type"))
		}
		if csp := res.Header.Get("Content-Security-Policy"); csp != console.ContentSecurityPolicy || strings.Contains(csp, "unsafe") {
			t.Errorf("GET %s: CSP %q", p, csp)
		}
		if cc := res.Header.Get("Cache-Control"); cc != "no-cache" {
			t.Errorf("GET %s: Cache-Control %q", p, cc)
		}
		index = string(body)
	}
	if strings.Contains(index, "<script>") || strings.Contains(index, "style=") || strings.Contains(index, "<style") {
		t.Errorf("index.html holds inline script or style:\n%s", index)
	}
	js := regexp.MustCompile(`src="(/assets/app-[A-Z0-9]+\.js)"`).FindStringSubmatch(index)
	if js == nil {
		t.Fatalf("index.html names no bundle:\n%s", index)
	}
	res := get(js[1])
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/javascript; charset=utf-8" ||
		res.Header.Get("Cache-Control") != "public, max-age=31536000, immutable" || res.Header.Get("ETag") == "" {
		t.Fatalf("GET %s: %d %v", js[1], res.StatusCode, res.Header)
	}
	if again := get(js[1], "If-None-Match", res.Header.Get("ETag")); again.StatusCode != http.StatusNotModified {
		t.Errorf("revalidating the bundle: %d, want 304", again.StatusCode)
	}
	for _, p := range []string{"/assets/", "/assets/nope.js", "/assets/../console.go", "/assets/a/b.js"} {
		if res := get(p); res.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", p, res.StatusCode)
		}
	}
}
