package openapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"reflect"
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
