package openapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"reflect"
	"slices"
	"testing"

	yaml "github.com/pb33f/go-yaml"
)

// The JSON form is the YAML document, key order included.
func TestJSONIsTheYAML(t *testing.T) {
	f, err := JSON()
	if err != nil {
		t.Fatal(err)
	}
	var fromYAML any
	if err := yaml.Unmarshal(source, &fromYAML); err != nil {
		t.Fatal(err)
	}
	viaJSON, err := json.Marshal(fromYAML)
	if err != nil {
		t.Fatal(err)
	}
	var want, got any
	if err := json.Unmarshal(viaJSON, &want); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(f.Body, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("openapi.json differs from openapi.yaml")
	}
	if !bytes.HasPrefix(f.Body, []byte("{\n  \"openapi\": \"3.1.0\",\n  \"info\"")) {
		t.Fatalf("the JSON does not keep the YAML's order: %.80s", f.Body)
	}
	if y := YAML(); y.ETag == f.ETag || !bytes.Equal(y.Body, source) {
		t.Fatal("the YAML is served as kept, under its own ETag")
	}
}

// The renderer embedded by `make web` is the file of the pinned npm package.
func TestRendererIsThePinnedPackage(t *testing.T) {
	want, err := os.ReadFile("../web/node_modules/redoc/bundles/" + Renderer)
	if os.IsNotExist(err) {
		t.Skip("web/node_modules not installed: run make web")
	}
	if err != nil {
		t.Fatal(err)
	}
	got, ok := Asset(Renderer)
	if !ok || !bytes.Equal(got.Body, want) {
		t.Fatalf("openapi/assets/%s is not web/node_modules' (embedded: %v): run make web", Renderer, ok)
	}
	page := DocsPage("/v1")
	if !bytes.Contains(page.Body, []byte(`<script src="/v1/docs/`+Renderer+`">`)) || !bytes.Contains(page.Body, []byte(`spec-url="/v1/openapi.json"`)) {
		t.Fatalf("the page does not load the renderer and the document by URL:\n%s", page.Body)
	}
	if bytes.Contains(page.Body, []byte("<script>")) || bytes.Contains(page.Body, []byte("://")) {
		t.Fatalf("the page holds an inline script or a foreign address:\n%s", page.Body)
	}
}

func TestServeAnswers304ToItsETag(t *testing.T) {
	f := YAML()
	for _, tc := range []struct {
		ifNoneMatch string
		status      int
	}{{"", 200}, {f.ETag, 304}, {`"other", W/` + f.ETag, 304}, {`"other"`, 200}, {"*", 304}} {
		r := httptest.NewRequest("GET", "/v1/openapi.yaml", nil)
		if tc.ifNoneMatch != "" {
			r.Header.Set("If-None-Match", tc.ifNoneMatch)
		}
		w := httptest.NewRecorder()
		Serve(w, r, f, "public, max-age=300")
		if w.Code != tc.status || w.Header().Get("ETag") != f.ETag {
			t.Errorf("If-None-Match %q: %d (ETag %q), want %d", tc.ifNoneMatch, w.Code, w.Header().Get("ETag"), tc.status)
		}
		if tc.status == 200 && !bytes.Equal(w.Body.Bytes(), f.Body) {
			t.Errorf("If-None-Match %q: the body is not the document", tc.ifNoneMatch)
		}
	}
}

// Operations reads each operation's query parameters (the path's and its own, through
// components) and whether it declares a body.
func TestOperations(t *testing.T) {
	ops, err := Operations()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Operation{}
	for _, o := range ops {
		byName[o.Method+" "+o.Path] = o
	}
	for name, want := range map[string]Operation{
		"GET /price":           {Query: []string{"endpoint", "depth", "multipv", "movetime_ms", "items", "plies"}},
		"GET /keys":            {Query: []string{"env"}},
		"GET /me":              {},
		"POST /eval":           {Body: true},
		"POST /billing/portal": {},
		"PATCH /me":            {Body: true},
		"DELETE /jobs/{id}":    {},
	} {
		got, ok := byName[name]
		if !ok {
			t.Errorf("no operation %s", name)
			continue
		}
		if !slices.Equal(got.Query, want.Query) || got.Body != want.Body {
			t.Errorf("%s: query %q, body %v; want %q, %v", name, got.Query, got.Body, want.Query, want.Body)
		}
	}
	if len(ops) < 40 {
		t.Errorf("only %d operations", len(ops))
	}

	for name, doc := range map[string]string{
		"an array parameter": `
paths:
  /x:
    get:
      parameters: [{name: ids, in: query, schema: {type: array, items: {type: string}}}]`,
		"a reference that does not resolve": `
paths:
  /x:
    parameters: [{$ref: '#/components/parameters/Nope'}]
    get: {}`,
	} {
		if _, err := parseOperations([]byte(doc)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// the operation's parameter overrides the path's of the same name
	ops, err = parseOperations([]byte(`
components:
  parameters:
    Q: {name: q, in: query, schema: {type: string}}
paths:
  /x:
    parameters: [{$ref: '#/components/parameters/Q'}, {name: h, in: header}]
    post:
      parameters: [{name: q, in: query, schema: {type: integer}}, {name: r, in: query}]
      requestBody: {content: {application/json: {}}}`))
	if err != nil || len(ops) != 1 || !slices.Equal(ops[0].Query, []string{"q", "r"}) || !ops[0].Body || ops[0].Method != "POST" {
		t.Fatalf("%+v, %v", ops, err)
	}
}
