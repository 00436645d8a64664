package client

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
)

// Every response header the document describes is read by the generated client. A
// header whose schema had no type (a bare const) was generated as an interface, which
// the client cannot bind: every answer carrying it failed to parse (a replayed answer's
// Idempotent-Replayed, GET /usage's Cache-Control). The guard reads the generated
// code; the parses show the two that failed.
func TestResponseHeadersParse(t *testing.T) {
	src, err := os.ReadFile("client.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	untyped := regexp.MustCompile(`BindStyledParameterWithOptions\("simple", "([A-Za-z-]+)", [^\n]*ParamLocationHeader[^\n]*Type: ""`)
	for _, m := range untyped.FindAllSubmatch(src, -1) {
		t.Errorf("the header %s has no type in the document: the client cannot read it", m[1])
	}
	answer := func(status int, header map[string]string) *http.Response {
		h := http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"req_1"}}
		for k, v := range header {
			h.Set(k, v)
		}
		return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader(`{}`))}
	}
	if _, err := ParseGetUsageResponse(answer(200, map[string]string{"Cache-Control": "no-store", "Usage-Total-USD": "0.000300"})); err != nil {
		t.Errorf("GET /usage with Cache-Control: no-store: %v", err)
	}
	if _, err := ParseCreateKeyResponse(answer(201, map[string]string{"Idempotent-Replayed": "true"})); err != nil {
		t.Errorf("a replayed POST /keys: %v", err)
	}
}
