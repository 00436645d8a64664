// Package openapi holds the API's OpenAPI 3.1 document (openapi.yaml, the source of
// truth for /v1), the documents and the reference page the server answers, and the
// Validator that checks traffic against the document.
//
// It imports nothing of ours: the HTTP layer serves what it gives, and every test
// package checks its traffic with the one Validator.
package openapi

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	yaml "github.com/pb33f/go-yaml"
)

//go:embed openapi.yaml
var source []byte

// assets holds the reference page's renderer, copied in by `make web`; the directory
// always holds its README, so the package builds without it.
//
//go:embed assets
var assets embed.FS

// Renderer is the file name of the reference page's script (Redoc's standalone bundle).
const Renderer = "redoc.standalone.js"

// A File is something the server answers as it is, with a validator for caches.
type File struct {
	Body        []byte
	ContentType string
	ETag        string // a strong ETag, quoted
}

func newFile(body []byte, contentType string) File {
	sum := sha256.Sum256(body)
	return File{Body: body, ContentType: contentType, ETag: `"` + hex.EncodeToString(sum[:16]) + `"`}
}

// YAML is the document as kept in the repository.
func YAML() File { return yamlFile() }

var yamlFile = sync.OnceValue(func() File { return newFile(source, "application/yaml") })

// JSON is the document converted to JSON, once, keeping the YAML's order of keys.
func JSON() (File, error) { return jsonFile() }

var jsonFile = sync.OnceValues(func() (File, error) {
	body, err := yamlToJSON(source)
	if err != nil {
		return File{}, fmt.Errorf("openapi.yaml to JSON: %w", err)
	}
	return newFile(body, "application/json"), nil
})

// Asset is a file of the reference page: ok is false when it is unknown, or when the
// binary was built without `make web`.
func Asset(name string) (File, bool) {
	if name != Renderer {
		return File{}, false
	}
	body, err := assets.ReadFile("assets/" + name)
	if err != nil {
		return File{}, false
	}
	return newFile(body, "text/javascript; charset=utf-8"), true
}

// DocsCSP is the reference page's Content-Security-Policy: its script, its document and
// its search worker come from this server, nothing inline runs, nothing is fetched from
// elsewhere. Redoc styles its components with <style> elements, hence style-src's
// 'unsafe-inline' (styles only: no script).
const DocsCSP = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; " +
	"font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// DocsPage is the reference page: Redoc renders the JSON document, loaded by URL. base
// is the path the API is served under (/v1).
func DocsPage(base string) File {
	base = strings.TrimRight(base, "/")
	if _, ok := Asset(Renderer); !ok {
		return newFile([]byte(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>chessd API reference</title></head>
<body><p>This binary was built without the reference page's renderer: run <code>make web</code> and build it again.
The document itself is at <a href="`+base+`/openapi.yaml">`+base+`/openapi.yaml</a> and <a href="`+base+`/openapi.json">`+base+`/openapi.json</a>.</p></body></html>
`), "text/html; charset=utf-8")
	}
	return newFile([]byte(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>chessd API reference</title>
<link rel="icon" href="data:,">
</head>
<body>
<redoc spec-url="`+base+`/openapi.json"></redoc>
<script src="`+base+`/docs/`+Renderer+`"></script>
</body>
</html>
`), "text/html; charset=utf-8")
}

// Serve answers f, or 304 Not Modified when the client's If-None-Match holds its ETag.
func Serve(w http.ResponseWriter, r *http.Request, f File, cacheControl string) {
	h := w.Header()
	h.Set("ETag", f.ETag)
	if cacheControl != "" {
		h.Set("Cache-Control", cacheControl)
	}
	if etagMatches(r.Header.Get("If-None-Match"), f.ETag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Type", f.ContentType)
	h.Set("Content-Length", strconv.Itoa(len(f.Body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(f.Body) //nolint:errcheck // the client went away
	}
}

// etagMatches applies If-None-Match's weak comparison (RFC 9110, 13.1.2).
func etagMatches(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == "*" || t == etag {
			return true
		}
	}
	return false
}

// yamlToJSON converts a YAML document to JSON, keeping the order of keys (a map would
// sort them, and the document reads top-down: openapi, info, paths, components).
func yamlToJSON(src []byte) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := writeJSON(&buf, &doc); err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, buf.Bytes(), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

func writeJSON(buf *bytes.Buffer, n *yaml.Node) error {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return fmt.Errorf("line %d: a document holds one value", n.Line)
		}
		return writeJSON(buf, n.Content[0])
	case yaml.AliasNode:
		return writeJSON(buf, n.Alias)
	case yaml.MappingNode:
		buf.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if k.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: a key must be a scalar", k.Line)
			}
			if i > 0 {
				buf.WriteByte(',')
			}
			name, _ := json.Marshal(k.Value)
			buf.Write(name)
			buf.WriteByte(':')
			if err := writeJSON(buf, n.Content[i+1]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	case yaml.SequenceNode:
		buf.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeJSON(buf, c); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		buf.Write(b)
	default:
		return fmt.Errorf("line %d: unexpected YAML node kind %v", n.Line, n.Kind)
	}
	return nil
}
