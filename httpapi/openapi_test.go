package httpapi_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"chessd/openapi"
)

// The document and its reference page are served as built, public and cacheable.
func TestOpenAPIDocumentAndDocsPage(t *testing.T) {
	e := newEnv(t, withWorkers(0))
	jsonDoc, err := openapi.JSON()
	if err != nil {
		t.Fatal(err)
	}
	renderer, built := openapi.Asset(openapi.Renderer)
	for _, tc := range []struct {
		path        string
		contentType string
		body        []byte // nil: not compared
		csp         bool
	}{
		{"/v1/openapi.json", "application/json", jsonDoc.Body, false},
		{"/v1/openapi.yaml", "application/yaml", openapi.YAML().Body, false},
		{"/v1/docs", "text/html; charset=utf-8", nil, true},
		{"/docs", "text/html; charset=utf-8", nil, true},
		{"/v1/docs/" + openapi.Renderer, "text/javascript; charset=utf-8", renderer.Body, false},
	} {
		t.Run(tc.path, func(t *testing.T) {
			if tc.path == "/v1/docs/"+openapi.Renderer && !built {
				t.Skip("built without make web")
			}
			res, body := getDoc(t, e, tc.path, "")
			if res.StatusCode != 200 || res.Header.Get("Content-Type") != tc.contentType {
				t.Fatalf("%d %q: %.200s", res.StatusCode, res.Header.Get("Content-Type"), body)
			}
			if tc.body != nil && !bytes.Equal(body, tc.body) {
				t.Fatal("not the embedded file")
			}
			if tc.csp {
				csp := res.Header.Get("Content-Security-Policy")
				if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-eval") ||
					strings.Contains(csp, "script-src 'self' 'unsafe-inline'") {
					t.Fatalf("Content-Security-Policy %q", csp)
				}
				if built && !bytes.Contains(body, []byte(`<script src="/v1/docs/`+openapi.Renderer+`"></script>`)) {
					t.Fatalf("the page does not load the renderer:\n%s", body)
				}
			}
			etag := res.Header.Get("ETag")
			if etag == "" {
				t.Fatal("no ETag")
			}
			res, _ = getDoc(t, e, tc.path, etag)
			if res.StatusCode != http.StatusNotModified {
				t.Fatalf("If-None-Match with its ETag: %d, want 304", res.StatusCode)
			}
		})
	}
	r := e.do("GET", "/v1/docs/other.js", "", nil)
	wantProblem(t, r, 404, "fix_request")
}

func getDoc(t *testing.T, e *env, path, ifNoneMatch string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", e.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ifNoneMatch != "" {
		req.Header.Set("If-None-Match", ifNoneMatch)
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, body
}
