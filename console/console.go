// Package console serves the web console: the single-page application that `make web`
// builds from web/console (esbuild, versions pinned by web/package-lock.json) into
// dist/, embedded here. Every page path answers index.html (the page routes itself in
// the browser); /assets/ answers the bundle. Nothing is fetched from elsewhere at run
// time, and every answer carries a Content-Security-Policy that lets in only this
// server's scripts and styles, with no inline code.
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed dist
var dist embed.FS

// Pages are the console's routes, each answered with index.html.
var Pages = []string{"/", "/play", "/jobs", "/usage", "/keys", "/account"}

// AssetPrefix is where the bundle is served; its files are named by content hash.
const AssetPrefix = "/assets/"

// ContentSecurityPolicy: scripts, styles and fetches from this origin only, nothing
// inline (the pages set styles through the CSSOM only). data: images are the board's
// piece and square drawings, which chessground's stylesheets carry inline.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// notBuilt is index.html in a binary built without `make web`.
const notBuilt = `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>chessd console</title></head>
<body><h1>The console is not built into this binary</h1><p>Run <code>make web</code> (or <code>make build</code>)
and build again. The API is at <a href="/v1/healthz">/v1</a>, its reference at <a href="/docs">/docs</a>.</p></body></html>
`

// Handler serves the console.
type Handler struct {
	index    []byte
	indexTag string
	built    bool
	assets   fs.FS
	// NotFound answers a request for a file the bundle does not hold; nil: a plain
	// 404. The API sets its own, so that every error it serves is problem+json.
	NotFound http.Handler
}

// New reads the embedded build.
func New() *Handler {
	h := &Handler{}
	index, err := dist.ReadFile("dist/index.html")
	if err == nil {
		h.index, h.built = index, true
	} else {
		h.index = []byte(notBuilt)
	}
	sum := sha256.Sum256(h.index)
	h.indexTag = `"` + hex.EncodeToString(sum[:8]) + `"`
	h.assets, _ = fs.Sub(dist, "dist/assets") // an absent directory serves nothing
	return h
}

// Built tells whether the binary holds the built console (not the "run make web" page).
func (h *Handler) Built() bool { return h.built }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", ContentSecurityPolicy)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Cross-Origin-Opener-Policy", "same-origin")
	if name, ok := strings.CutPrefix(r.URL.Path, AssetPrefix); ok {
		h.asset(w, r, name)
		return
	}
	// The page changes with each build: the browser asks again each time (a 304 when
	// it has this one).
	hd.Set("Cache-Control", "no-cache")
	hd.Set("ETag", h.indexTag)
	hd.Set("Content-Type", "text/html; charset=utf-8")
	http.ServeContent(w, r, "index.html", time.Time{}, bytes.NewReader(h.index)) // no Last-Modified: the ETag decides
}

// asset serves a file of the bundle. Its name holds its content's hash, so a browser
// may keep it for a year: a new build has new names.
func (h *Handler) asset(w http.ResponseWriter, r *http.Request, name string) {
	var b []byte
	var err error = fs.ErrNotExist
	if h.assets != nil && name != "" && fs.ValidPath(name) && !strings.Contains(name, "/") {
		b, err = fs.ReadFile(h.assets, name)
	}
	if err != nil {
		if h.NotFound != nil {
			h.NotFound.ServeHTTP(w, r)
		} else {
			http.Error(w, "no such file", http.StatusNotFound)
		}
		return
	}
	ctype := mime.TypeByExtension(path.Ext(name))
	if strings.HasSuffix(name, ".LEGAL.txt") || ctype == "" {
		ctype = "text/plain; charset=utf-8"
	}
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	sum := sha256.Sum256(b)
	w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:8])+`"`)
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(b))
}
