package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"chessd/analysis"
	"chessd/domain"
)

// The door's property: nothing it accepts can stop a projection. Every string that
// comes out of an accepted body or header is valid UTF-8 without NUL or any other
// control character (tab, newline and carriage return only in fields tagged
// multiline), so PostgreSQL stores it as text wherever it ends up.

// requestTypes are the JSON bodies of every endpoint, as their handlers decode them.
var requestTypes = map[string]func() any{
	"signup":     func() any { return &signupRequest{} },
	"createKey":  func() any { return &createKeyRequest{} },
	"updateKey":  func() any { return &map[string]json.RawMessage{} },
	"rotate":     func() any { return &rotateRequest{} },
	"eval":       func() any { return &analysis.Request{} },
	"batch":      func() any { return &batchRequest{} },
	"analyze":    func() any { return &analyzeRequest{} },
	"position":   func() any { return &positionRequest{} },
	"checkout":   func() any { return &checkoutRequest{} },
	"dispute":    func() any { return &disputeRequest{} },
	"webhook":    func() any { return &webhookRequest{} },
	"verify":     func() any { return &verifyEmailRequest{} },
	"recover":    func() any { return &recoverRequest{} },
	"recoverKey": func() any { return &recoverKeyRequest{} },
	"unmodelled": func() any { return &map[string]any{} },
}

func FuzzDecodeBodies(f *testing.F) {
	for _, s := range []string{
		`{"email":"a@b.co","name":"Ada","agent":"bot/1","source":"docs"}`, `{"email":"a@b.co","name":"\u0000"}`,
		`{"label":"x","scopes":["eval"],"budget_usd":"1.5","env":"test"}`, `{"label":"\ud800"}`, `{"budget_units":null}`,
		`{"grace_seconds":10}`, `{"fen":"8/8/8/8/8/8/8/K6k w - - 0 1","depth":3,"options":{"elo":1500}}`,
		`{"fens":["a","\u007f"],"depth":"x"}`, `{"pgn":"[Event \"x\"]\n1. e4 *","multipv":1}`, `{"plan":"pro"}`,
		"{\"name\":\"\xff\"}", `{"a":{"b":["\u0085"]}}`, `[]`, `null`, `{"fen":5,"fen":6}`, `{"":1e500}`,
		// where a faster decoder could read otherwise than encoding/json (the one pass's)
		`{"FEN":"x","Depth":3}`, `{"depth":1.0}`, `{"depth":1e1}`, `{"depth":-0}`, `{"depth":99999999999999999999}`,
		`{"options":null,"fen":null}`, `{"options":{"elo":1,"x":1}}`, `{"depth":"10"}`, `{"fen":"a"} }`, `{"fen":"a"}{}`,
		`{"":{""}}`, `{"fens":["a",]}`, `{"depth":01}`, `{"options":{"chess960":1}}`, `{"fen":"a","fen":null}`,
		`{"fens":["a",null]}`, `{"scopes":[null],"label":null}`, `{"fens":[],"depth":null}`,
	} {
		f.Add(s)
	}
	f.Add(`{"depth":1,"Depth":30}`)
	f.Add(`{"options":{"elo":1,"x":{"a":[{"b":1,"b":2}]}}}`)
	f.Add(`{"fen":"a","f\u0065n":"b"}`)
	f.Fuzz(func(t *testing.T, body string) {
		if json.Valid([]byte(body)) {
			_, twice := memberTwice([]byte(body))
			if want := givenTwice(t, body); twice != want {
				t.Fatalf("%q: memberTwice says %v, the token walk %v", body, twice, want)
			}
		}
		for name, mk := range requestTypes {
			v, slow := mk(), mk()
			err, slowErr := decodeBytes([]byte(body), v), decodeFields([]byte(body), slow)
			if (err == nil) != (slowErr == nil) || err == nil && !reflect.DeepEqual(v, slow) {
				t.Fatalf("%s: %q: one pass gives %v %+v, field by field %v %+v", name, body, err, v, slowErr, slow)
			}
			if err == nil && givenTwice(t, body) {
				t.Fatalf("%s: %q accepted with a member given twice", name, body)
			}
			if err != nil {
				if domain.ErrorCode(err) != domain.CodeInvalid {
					t.Fatalf("%s: %q refused with %v, not a 400", name, body, err)
				}
				continue
			}
			assertStorable(t, name, reflect.ValueOf(v), false)
			if req, ok := v.(*signupRequest); ok {
				e, err := domain.NewAccount("acct_x", domain.Signup(*req), time.Now())
				if err == nil {
					for _, s := range []string{e.Email, e.Name, e.Agent, e.Source} {
						if p := domain.TextProblem(s, false); p != "" {
							t.Fatalf("AccountCreated from %q holds %q: %s", body, s, p)
						}
					}
				}
			}
		}
	})
}

// givenTwice is memberTwice's reference: encoding/json's token stream, one set of
// names per object.
func givenTwice(t *testing.T, body string) bool {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	type frame struct {
		object, nameNext bool
		names            []string
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].object {
			stack[n-1].nameNext = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return false // the end, or not JSON: nothing given twice was seen
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				stack = append(stack, &frame{object: v == '{', nameNext: v == '{'})
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if n := len(stack); n > 0 && stack[n-1].nameNext {
				top := stack[n-1]
				for _, seen := range top.names {
					if seen == v {
						return true
					}
				}
				top.names, top.nameNext = append(top.names, v), false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
}

// assertStorable walks v and fails on any string that breaks the text rules.
func assertStorable(t *testing.T, path string, v reflect.Value, multiline bool) {
	t.Helper()
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			assertStorable(t, path, v.Elem(), multiline)
		}
	case reflect.String:
		if p := domain.TextProblem(v.String(), multiline); p != "" {
			t.Fatalf("%s: accepted %q, which %s", path, v.String(), p)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() {
				assertStorable(t, path+"."+f.Name, v.Field(i), f.Tag.Get("text") == "multiline")
			}
		}
	case reflect.Slice:
		if raw, ok := v.Interface().(json.RawMessage); ok {
			// Numbers stay json.Number: a valid number too large for a float64
			// (1e500) is the handler's field decoder's to refuse, not a string.
			var inner any
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.UseNumber()
			if err := dec.Decode(&inner); err != nil {
				t.Fatalf("%s: accepted raw %q that does not decode: %v", path, raw, err)
			}
			assertStorable(t, path, reflect.ValueOf(&inner), multiline)
			return
		}
		for i := range v.Len() {
			assertStorable(t, path, v.Index(i), multiline)
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			assertStorable(t, path+"."+k.String(), v.MapIndex(k), multiline)
		}
	}
}

// FuzzHeaders checks the parsing of every header the service reads, and of the path
// and query: no panic, and whatever is accepted is storable text.
func FuzzHeaders(f *testing.F) {
	f.Add("Bearer ce_live_abc", "idem-1", "3", "req-1", "/v1/jobs/job_1", "group_by=key")
	f.Add("bearer  x\x00", "a\x00b", "-1", "r\x7f", "/v1/jobs/\x00", "a=%00")
	f.Add("Basic abc", "", "99999999999999999999", "", "/v1/keys/\xff", "\xff=1")
	f.Fuzz(func(t *testing.T, auth, idem, lastID, reqID, path, query string) {
		r := &http.Request{Method: "GET", URL: &url.URL{Path: path, RawQuery: query}, Header: http.Header{},
			Proto: "HTTP/1.1", Host: "chessd.test", RequestURI: path}
		r.Header["Authorization"] = []string{auth}
		r.Header["Last-Event-Id"] = []string{lastID}
		if secret, ok, err := bearer(r); ok && err == nil && (secret == "" || secret != strings.TrimSpace(secret)) {
			t.Fatalf("bearer(%q) = %q", auth, secret)
		}
		if checkIdempotencyKey(idem) == nil && (domain.TextProblem(idem, false) != "" || len(idem) > 255) {
			t.Fatalf("Idempotency-Key %q accepted", idem)
		}
		if validRequestID(reqID) && domain.TextProblem(reqID, false) != "" {
			t.Fatalf("X-Request-Id %q accepted", reqID)
		}
		if n, err := lastEventID(r); err == nil && n < 0 {
			t.Fatalf("Last-Event-ID %q read as %d", lastID, n)
		}
		if err := door(r); err == nil {
			if domain.TextProblem(r.URL.Path, false) != "" {
				t.Fatalf("path %q accepted", path)
			}
			for k, vs := range r.URL.Query() {
				for _, v := range append(vs, k) {
					if domain.TextProblem(v, false) != "" {
						t.Fatalf("query %q accepted", query)
					}
				}
			}
		} else if c := domain.ErrorCode(err); c != domain.CodeInvalid && c != codeHeadersTooLarge {
			t.Fatalf("door: %v", err)
		}
	})
}
