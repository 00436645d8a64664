package openapitest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Check finds each kind of mismatch, and none in an exchange that matches.
func TestCheck(t *testing.T) {
	v := newValidator(t)
	problem := `{"type":"http://x/v1/problems/not-found","title":"Not found","status":404,"detail":"no","next_action":"fix_request","instance":"/v1/x","request_id":"req_1"}`
	for _, tc := range []struct {
		name          string
		method        string
		target        string
		header        map[string]string
		body          string
		status        int
		contentType   string
		resHeader     map[string]string
		resBody       string
		want          string // a part of the one mismatch; "" for none
		noContentType bool
	}{
		{name: "matches", method: "GET", target: "/v1/healthz", status: 200, contentType: "application/json",
			resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{"status":"ok"}`},
		{name: "a field the document lacks", method: "GET", target: "/v1/healthz", status: 200, contentType: "application/json",
			resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{"status":"ok","extra":1}`, want: "does not match the document"},
		{name: "a required header missing", method: "GET", target: "/v1/healthz", status: 200, contentType: "application/json",
			resBody: `{"status":"ok"}`, want: "X-Request-Id"},
		{name: "a status the operation does not list", method: "GET", target: "/v1/healthz", status: 402, contentType: "application/problem+json",
			resHeader: map[string]string{"X-Request-Id": "r"}, resBody: problem, want: "402"},
		{name: "a refused request answered with a problem", method: "POST", target: "/v1/signup", body: `{"email":"a@example.com","nickname":"x"}`,
			status: 400, contentType: "application/problem+json", resHeader: map[string]string{"X-Request-Id": "r"},
			resBody: strings.Replace(problem, "404", "400", 1)},
		{name: "a refused request accepted", method: "POST", target: "/v1/signup", body: `{"email":"a@example.com","nickname":"x"}`,
			status: 201, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"},
			resBody: `{"api_key":"ce_live_x","key_id":"key_x","plan":"free","account_id":"acct_x"}`, want: "a request the document refuses"},
		{name: "a body without a Content-Type is JSON", method: "POST", target: "/v1/verify-email", body: `{"token":"ev_1"}`, noContentType: true,
			status: 200, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"},
			resBody: `{"account_id":"acct_1","email":"a@example.com","email_verified":true}`},
		{name: "a path refused before routing", method: "GET", target: "/v1/keys/%FF", status: 400,
			contentType: "application/problem+json", resBody: strings.Replace(problem, "404", "400", 1)},
		{name: "an unknown path answered with a problem", method: "GET", target: "/v1/nowhere", status: 404,
			contentType: "application/problem+json", resBody: problem},
		{name: "an unknown path answered otherwise", method: "GET", target: "/v1/nowhere", status: 200,
			contentType: "application/json", resBody: `{}`, want: "no operation"},
		{name: "outside the API", method: "GET", target: "/metrics", status: 200, contentType: "text/plain", resBody: "up 1\n"},
		{name: "a 405 without Allow", method: "PUT", target: "/v1/healthz", status: 405,
			contentType: "application/problem+json", resBody: strings.Replace(problem, "404", "405", 1), want: "Allow"},
		{name: "a stream is not read", method: "GET", target: "/v1/jobs/job_1/events", header: map[string]string{"Authorization": "Bearer k"},
			status: 200, contentType: "text/event-stream", resHeader: map[string]string{"X-Request-Id": "r", "Cache-Control": "no-store"}, resBody: "id: 1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			if tc.body != "" && !tc.noContentType {
				req.Header.Set("Content-Type", "application/json")
			}
			for k, val := range tc.header {
				req.Header.Set(k, val)
			}
			res := &http.Response{StatusCode: tc.status, Header: http.Header{"Content-Type": {tc.contentType}}}
			for k, val := range tc.resHeader {
				res.Header.Set(k, val)
			}
			got := v.Check(req, []byte(tc.body), res, []byte(tc.resBody))
			switch {
			case tc.want == "" && len(got) > 0:
				t.Fatalf("mismatches in a matching exchange: %q", got)
			case tc.want != "" && (len(got) != 1 || !strings.Contains(got[0], tc.want)):
				t.Fatalf("got %q, want one mismatch mentioning %q", got, tc.want)
			}
		})
	}
}

func newValidator(t *testing.T) *Validator {
	t.Helper()
	v, err := NewValidator()
	if err != nil {
		t.Fatal(err)
	}
	return v
}
