// Package openapitest checks HTTP traffic against the OpenAPI document of package
// openapi: every test package runs the exchanges it makes through one Validator. It is
// kept apart from package openapi so that the server does not carry the validator.
package openapitest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	verrors "github.com/pb33f/libopenapi-validator/errors"
	"github.com/pb33f/libopenapi-validator/helpers"
	"github.com/pb33f/libopenapi-validator/parameters"
	"github.com/pb33f/libopenapi-validator/paths"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/pb33f/libopenapi/orderedmap"

	"chessd/openapi"
)

// Validator checks requests and answers against the document with
// libopenapi-validator (OpenAPI 3.1, JSON Schema 2020-12), so that the document cannot
// drift from the handlers: the tests run every exchange they make through it.
//
// The rules: a response must be what the document says of its operation (status,
// content type, body, required headers), a problem's status member is the answer's
// status, an answer whose response declares content is not empty, and a 204 or 304 has
// no body. A request the document refuses is fine when the server refused it too
// (tests send malformed requests on purpose), but a mismatch when the server accepted
// it (status below 400): the document is stricter than the API, or the server let
// through what the document does not declare. Refused as the document has it: a query
// parameter the operation does not declare, a parameter given twice (unless its schema
// is an array), a query that does not parse, a request header it does not declare
// (standard HTTP, browser and proxy headers aside: ignoredHeaders), a request body on
// an operation that declares none. A body without a Content-Type is read as JSON, as
// the API reads it. A path under the API's base (/v1) or method the document does not
// have must be answered with a problem (404 or 405, or a 4xx of the checks made before
// routing); paths outside it that the document does not list (/metrics) are not the
// API's. Streamed answers (text/event-stream) are checked for status and content type,
// not body.
type Validator struct {
	v       validator.Validator
	strict  parameters.ParameterValidator // undeclared query parameters and request headers
	doc     *v3.Document
	find    *config.ValidationOptions // finds a request's path in doc
	problem *base.Schema
	schemas schema_validation.SchemaValidator
	base    string // the API's path (/v1): what is outside it and not in the document is not the API's
}

// ignoredHeaders are request headers no operation declares and none needs to: HTTP's
// own, and what browsers, proxies and tracing add, beside libopenapi-validator's
// defaults (Accept, Authorization, Content-Type, Content-Length, User-Agent, Host,
// Connection, Accept-Encoding, Accept-Language, Cache-Control, Pragma, Origin,
// Referer, Cookie, If-Match, If-None-Match, If-Modified-Since, Transfer-Encoding,
// X-Forwarded-For, X-Forwarded-Proto, X-Real-IP, X-Request-Id, ...). Sec-* (the browser's
// fetch metadata and client hints) are ignored by pattern. Any other undeclared header
// is a mismatch when the server accepted the request: the API's own headers
// (Idempotency-Key, Last-Event-ID) where the operation does not take them, or a header
// the document should declare.
var ignoredHeaders = []string{
	"expect", "te", "trailer", "upgrade", "keep-alive", "proxy-connection", "via", "forwarded",
	"x-forwarded-host", "x-forwarded-port", "accept-charset", "dnt", "priority", "upgrade-insecure-requests",
	"traceparent", "tracestate", "baggage", "purpose", "sec-purpose",
}

// NewValidator builds a Validator of openapi's document, which must itself be a
// valid OpenAPI 3.1 document.
func NewValidator() (*Validator, error) {
	doc, err := libopenapi.NewDocument(openapi.YAML().Body)
	if err != nil {
		return nil, fmt.Errorf("openapi: parse: %w", err)
	}
	v, errs := validator.NewValidator(doc, config.WithRejectUndeclaredRequestBody())
	if len(errs) > 0 {
		return nil, fmt.Errorf("openapi: build the validator: %w", errors.Join(errs...))
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		return nil, fmt.Errorf("openapi: the document is not valid OpenAPI: %s", describe(verrs))
	}
	model, merr := doc.BuildV3Model()
	if merr != nil {
		return nil, fmt.Errorf("openapi: model: %w", merr)
	}
	p, ok := model.Model.Components.Schemas.Get("Problem")
	if !ok {
		return nil, errors.New("openapi: no Problem schema")
	}
	if len(model.Model.Servers) != 1 || !strings.HasPrefix(model.Model.Servers[0].URL, "/") {
		return nil, errors.New("openapi: the document must name one server by its path (/v1)")
	}
	strict := parameters.NewParameterValidator(&model.Model, config.WithStrictMode(),
		config.WithStrictIgnoredHeadersExtra(ignoredHeaders...), config.WithStrictIgnorePaths("$.headers.sec-*"))
	return &Validator{v: v, strict: strict, doc: &model.Model, find: config.NewValidationOptions(),
		problem: p.Schema(), schemas: schema_validation.NewSchemaValidator(),
		base: strings.TrimRight(model.Model.Servers[0].URL, "/")}, nil
}

// Check returns what in one exchange does not match the document, one sentence per
// mismatch; none when it matches. reqBody and resBody are the whole bodies (resBody
// is ignored for a streamed answer).
func (v *Validator) Check(req *http.Request, reqBody []byte, res *http.Response, resBody []byte) []string {
	if !strings.HasPrefix(req.URL.Path, v.base+"/") {
		// not the API: the console's pages, /docs, the operator's /metrics (the
		// validator would otherwise match /keys, a page, to the API's /keys)
		return nil
	}
	req = req.Clone(req.Context())
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	req.ContentLength = int64(len(reqBody))
	if len(reqBody) > 0 && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json") // the API reads every body as JSON
	}
	reqOK, reqErrs := v.v.ValidateHttpRequestSync(req)
	if !reqOK && unrouted(reqErrs) {
		return v.checkUnrouted(req, res, resBody)
	}
	pathItem, _, pathValue := paths.FindPath(req, v.doc, v.find)
	if pathItem == nil {
		return []string{"the validator routed the request, but cannot find its path again"}
	}
	op := helpers.ExtractOperation(req, pathItem)
	reqErrs = append(reqErrs, v.undeclared(req, pathItem, op, pathValue)...)
	var out []string
	if len(reqErrs) > 0 && res.StatusCode < 400 {
		out = append(out, fmt.Sprintf("the server answered %d to a request the document refuses: %s", res.StatusCode, describe(reqErrs)))
	}
	if !streamed(res) {
		out = append(out, answerBody(op, res, resBody)...)
	}
	res2 := *res
	res2.Header = res.Header.Clone()
	if streamed(res) {
		resBody = nil
	}
	res2.Body = io.NopCloser(bytes.NewReader(resBody))
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	if ok, errs := v.v.ValidateHttpResponse(req, &res2); !ok {
		out = append(out, fmt.Sprintf("the %d answer does not match the document: %s", res.StatusCode, describe(errs)))
	}
	return out
}

// undeclared finds what the request holds that op does not declare: query parameters
// and headers (libopenapi-validator's strict mode, which reports nothing more while the
// parameters have other faults: those come from the validator itself), a query
// parameter given twice whose schema is not an array, and a query that does not parse.
func (v *Validator) undeclared(req *http.Request, pathItem *v3.PathItem, op *v3.Operation, pathValue string) []*verrors.ValidationError {
	var out []*verrors.ValidationError
	if _, errs := v.strict.ValidateQueryParamsWithPathItem(req, pathItem, pathValue); len(errs) > 0 {
		out = append(out, onlyStrict(errs)...)
	}
	if _, errs := v.strict.ValidateHeaderParamsWithPathItem(req, pathItem, pathValue); len(errs) > 0 {
		out = append(out, onlyStrict(errs)...)
	}
	if req.URL.RawQuery == "" || op == nil {
		return out
	}
	q, err := url.ParseQuery(req.URL.RawQuery)
	if err != nil { // url.Values drops what it cannot read, and the checks above never see it
		out = append(out, &verrors.ValidationError{ValidationType: helpers.ParameterValidationQuery,
			Message: fmt.Sprintf("the query does not parse: %v", err)})
	}
	for _, p := range slices.Concat(pathItem.Parameters, op.Parameters) {
		if p.In != "query" || len(q[p.Name]) < 2 {
			continue
		}
		if p.Schema != nil && slices.Contains(p.Schema.Schema().Type, "array") {
			continue
		}
		out = append(out, &verrors.ValidationError{ValidationType: helpers.ParameterValidationQuery,
			Message: fmt.Sprintf("query parameter '%s' is given %d times; its schema takes one value", p.Name, len(q[p.Name]))})
	}
	return out
}

func onlyStrict(errs []*verrors.ValidationError) []*verrors.ValidationError {
	var out []*verrors.ValidationError
	for _, e := range errs {
		if e.ValidationType == verrors.StrictValidationType {
			out = append(out, e)
		}
	}
	return out
}

// answerBody checks an answer's body against what the document can say of it beyond
// its schema: none on a 204 or 304, some where op's response declares content, and a
// problem's status member equal to the answer's status.
func answerBody(op *v3.Operation, res *http.Response, body []byte) []string {
	if res.StatusCode == http.StatusNoContent || res.StatusCode == http.StatusNotModified {
		if len(body) > 0 {
			return []string{fmt.Sprintf("the %d answer has a body of %d bytes", res.StatusCode, len(body))}
		}
		return nil
	}
	if len(body) == 0 {
		if r := responseOf(op, res.StatusCode); r != nil && orderedmap.Len(r.Content) > 0 {
			var types []string
			for mt := range r.Content.KeysFromOldest() {
				types = append(types, mt)
			}
			return []string{fmt.Sprintf("the %d answer is empty, but the document declares its content (%s)", res.StatusCode, strings.Join(types, ", "))}
		}
		return nil
	}
	return problemStatus(res, body)
}

// responseOf is op's response for status: its own code, its range (4XX) or default.
func responseOf(op *v3.Operation, status int) *v3.Response {
	if op == nil || op.Responses == nil {
		return nil
	}
	if op.Responses.Codes != nil {
		for _, code := range []string{strconv.Itoa(status), fmt.Sprintf("%dXX", status/100)} {
			if r := op.Responses.Codes.GetOrZero(code); r != nil {
				return r
			}
		}
	}
	return op.Responses.Default
}

// problemStatus: a problem's status member, when present, is the answer's status (RFC
// 9457, 3.1.2).
func problemStatus(res *http.Response, body []byte) []string {
	if mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); mt != "application/problem+json" {
		return nil
	}
	var p struct {
		Status *json.Number `json:"status"`
	}
	if json.Unmarshal(body, &p) != nil || p.Status == nil {
		return nil // the schema check says what is wrong with it
	}
	if p.Status.String() != strconv.Itoa(res.StatusCode) {
		return []string{fmt.Sprintf("the %d answer is a problem whose status is %s", res.StatusCode, p.Status)}
	}
	return nil
}

// unrouted says whether the document has no operation for the request's path and method.
func unrouted(errs []*verrors.ValidationError) bool {
	for _, e := range errs {
		if e.ValidationType == helpers.PathValidation && e.ValidationSubType == helpers.ValidationMissing ||
			e.ValidationSubType == helpers.ValidationMissingOperation {
			return true
		}
	}
	return false
}

// checkUnrouted: a path or method the document lacks must be refused with a problem:
// 404 or 405 from the router, or a 4xx of the checks made before routing (a path that
// breaks the text rules, headers over the limit).
func (v *Validator) checkUnrouted(req *http.Request, res *http.Response, body []byte) []string {
	if res.StatusCode < 400 || res.StatusCode > 499 {
		return []string{fmt.Sprintf("the document has no operation for this request, but the server answered %d", res.StatusCode)}
	}
	var out []string
	if mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); mt != "application/problem+json" {
		out = append(out, fmt.Sprintf("the %d answer to a request the document has no operation for is %q, not application/problem+json", res.StatusCode, mt))
	} else if ok, errs := v.schemas.ValidateSchemaBytes(v.problem, body); !ok {
		out = append(out, fmt.Sprintf("the %d answer is not a Problem: %s", res.StatusCode, describe(errs)))
	} else {
		out = append(out, problemStatus(res, body)...)
	}
	if res.StatusCode == http.StatusMethodNotAllowed && res.Header.Get("Allow") == "" {
		out = append(out, "a 405 answer without Allow")
	}
	return out
}

func streamed(res *http.Response) bool {
	mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	return mt == "text/event-stream" || mt == "application/x-ndjson" // read live by the client, not buffered
}

// describe renders the validator's errors on one line, with each schema failure's
// field and reason.
func describe(errs []*verrors.ValidationError) string {
	var parts []string
	for _, e := range errs {
		s := e.Message
		if e.Reason != "" && e.Reason != e.Message {
			s += " (" + e.Reason + ")"
		}
		for _, f := range e.SchemaValidationErrors {
			where := f.FieldPath
			if where == "" {
				where = "$"
			}
			s += fmt.Sprintf("; %s: %s", where, f.Reason)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " | ")
}

// Handler runs every exchange of next through the Validator and calls report, once per
// exchange, with the request and what does not match (method and path first). Streamed
// answers pass through as they are written.
func (v *Validator) Handler(next http.Handler, report func(req *http.Request, msg string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		r.Body.Close()
		if err != nil {
			report(r, fmt.Sprintf("%s %s: reading the request body: %v", r.Method, r.URL.Path, err))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		orig := r.Clone(r.Context())
		next.ServeHTTP(rec, r)
		if r.Context().Err() != nil && rec.status == 499 {
			return // the client left: no answer reached anyone (httpapi's 499, for the logs)
		}
		res := &http.Response{StatusCode: rec.status, Header: rec.Header().Clone(), Request: orig}
		if msgs := v.Check(orig, body, res, rec.body.Bytes()); len(msgs) > 0 {
			report(orig, fmt.Sprintf("%s %s: %s", r.Method, r.URL.RequestURI(), strings.Join(msgs, "; ")))
		}
	})
}

// recorder copies what a handler writes, except a streamed body.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	stream bool
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
		ct := r.Header().Get("Content-Type")
		r.stream = strings.HasPrefix(ct, "text/event-stream") || strings.HasPrefix(ct, "application/x-ndjson")
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	if !r.stream {
		r.body.Write(b)
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flush, deadlines).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// Flush passes a flush on (streams).
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// RoundTripper checks every exchange a client makes through next (nil:
// http.DefaultTransport) and calls report with the request and what does not match.
// Streamed answers are checked for status and content type and handed on unread; a
// body that fails half-way (the server died) is handed on as it came, unchecked.
func (v *Validator) RoundTripper(next http.RoundTripper, report func(req *http.Request, msg string)) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripper{v: v, next: next, report: report}
}

type roundTripper struct {
	v      *Validator
	next   http.RoundTripper
	report func(*http.Request, string)
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
		req = req.Clone(req.Context())
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	res, err := t.next.RoundTrip(req)
	if err != nil {
		return res, err
	}
	if streamed(res) {
		t.check(req, body, res, nil)
		return res, nil
	}
	resBody, readErr := io.ReadAll(res.Body)
	res.Body.Close()
	if readErr != nil {
		res.Body = io.NopCloser(io.MultiReader(bytes.NewReader(resBody), errReader{readErr}))
		return res, nil
	}
	res.Body = io.NopCloser(bytes.NewReader(resBody))
	t.check(req, body, res, resBody)
	return res, nil
}

func (t roundTripper) check(req *http.Request, body []byte, res *http.Response, resBody []byte) {
	if msgs := t.v.Check(req, body, res, resBody); len(msgs) > 0 {
		t.report(req, fmt.Sprintf("%s %s: %s", req.Method, req.URL.RequestURI(), strings.Join(msgs, "; ")))
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
