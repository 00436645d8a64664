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
	problem400 := strings.Replace(problem, "404", "400", 1)
	portal := `{"portal_url":"http://x/v1/me","account_id":"acct_1"}`
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
			resHeader: map[string]string{"X-Request-Id": "r"}, resBody: strings.Replace(problem, "404", "402", 1), want: "402"},
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

		// what the document does not declare, accepted: a query parameter, a parameter
		// given twice, a request header, a request body
		{name: "an undeclared query parameter accepted", method: "GET", target: "/v1/healthz?bogus=1", status: 200, contentType: "application/json",
			resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{"status":"ok"}`, want: "bogus"},
		{name: "an undeclared query parameter refused", method: "GET", target: "/v1/healthz?bogus=1", status: 400,
			contentType: "application/problem+json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: problem400},
		{name: "a declared query parameter", method: "GET", target: "/v1/keys?env=test", header: map[string]string{"Authorization": "Bearer k"},
			status: 200, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{"keys":[]}`},
		{name: "a parameter given twice accepted", method: "GET", target: "/v1/keys?env=live&env=test", header: map[string]string{"Authorization": "Bearer k"},
			status: 200, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{"keys":[]}`, want: "env"},
		{name: "a parameter given twice refused", method: "GET", target: "/v1/keys?env=live&env=test", header: map[string]string{"Authorization": "Bearer k"},
			status: 400, contentType: "application/problem+json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: problem400},
		{name: "a query that does not parse, accepted", method: "GET", target: "/v1/keys?env=test;x=1", header: map[string]string{"Authorization": "Bearer k"},
			status: 200, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{"keys":[]}`, want: "does not parse"},
		{name: "an undeclared request header accepted", method: "GET", target: "/v1/healthz", header: map[string]string{"X-Bogus": "1"},
			status: 200, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{"status":"ok"}`, want: "X-Bogus"},
		{name: "a header the API knows, where the operation does not declare it", method: "GET", target: "/v1/healthz", header: map[string]string{"Idempotency-Key": "k1"},
			status: 200, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{"status":"ok"}`, want: "Idempotency-Key"},
		{name: "standard and declared request headers", method: "POST", target: "/v1/billing/portal", header: map[string]string{
			"Authorization": "Bearer k", "Accept": "application/json", "Accept-Encoding": "gzip", "Accept-Language": "en", "User-Agent": "t/1",
			"X-Request-Id": "my-trace", "Idempotency-Key": "k1", "Origin": "http://x", "Referer": "http://x/", "Sec-Fetch-Mode": "cors",
			"Sec-Ch-Ua-Platform": `"Linux"`, "Priority": "u=1, i", "Cache-Control": "no-cache", "Pragma": "no-cache", "Expect": "100-continue",
			"X-Forwarded-For": "203.0.113.7", "Via": "1.1 proxy", "Traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
			status: 200, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: portal},
		{name: "a request body where none is declared, accepted", method: "POST", target: "/v1/billing/portal", header: map[string]string{"Authorization": "Bearer k"},
			body: `{"x":1}`, status: 200, contentType: "application/json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: portal, want: "request body"},
		{name: "a request body where none is declared, refused", method: "POST", target: "/v1/billing/portal", header: map[string]string{"Authorization": "Bearer k"},
			body: `{"x":1}`, status: 400, contentType: "application/problem+json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: problem400},

		// answers: a problem's status is the answer's, content where the document
		// declares it, none on a 204
		{name: "a problem whose status is not the answer's", method: "GET", target: "/v1/keys", header: map[string]string{"Authorization": "Bearer k"},
			status: 400, contentType: "application/problem+json", resHeader: map[string]string{"X-Request-Id": "r"}, resBody: problem, want: "status"},
		{name: "an unrouted problem whose status is not the answer's", method: "GET", target: "/v1/nowhere", status: 404,
			contentType: "application/problem+json", resBody: problem400, want: "status"},
		{name: "an empty answer where the document declares content", method: "GET", target: "/v1/healthz", status: 200, contentType: "application/json",
			resHeader: map[string]string{"X-Request-Id": "r"}, want: "empty"},
		{name: "an empty problem", method: "GET", target: "/v1/healthz", status: 400, contentType: "application/problem+json",
			resHeader: map[string]string{"X-Request-Id": "r"}, want: "empty"},
		{name: "a 204", method: "DELETE", target: "/v1/keys/key_1", header: map[string]string{"Authorization": "Bearer k"},
			status: 204, resHeader: map[string]string{"X-Request-Id": "r"}},
		{name: "a 204 with a body", method: "DELETE", target: "/v1/keys/key_1", header: map[string]string{"Authorization": "Bearer k"},
			status: 204, resHeader: map[string]string{"X-Request-Id": "r"}, resBody: `{}`, want: "204"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			if tc.body != "" && !tc.noContentType {
				req.Header.Set("Content-Type", "application/json")
			}
			for k, val := range tc.header {
				req.Header.Set(k, val)
			}
			res := &http.Response{StatusCode: tc.status, Header: http.Header{}}
			if tc.contentType != "" {
				res.Header.Set("Content-Type", tc.contentType)
			}
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
