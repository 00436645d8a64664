package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	gojson "github.com/goccy/go-json"
	"github.com/shopspring/decimal"

	"chessd/domain"
)

// decode reads exactly one JSON object into v, refusing unknown fields, trailing data
// and bodies over the limit. An empty body (or null) is allowed only when optional is
// true.
func decode(r *http.Request, v any, optional bool) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return decodeReadError(err)
	}
	return decodeBody(body, v, optional)
}

// decodeBody is decode of a body already read.
func decodeBody(body []byte, v any, optional bool) error {
	if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || optional && string(trimmed) == "null" {
		if optional {
			return nil
		}
		return bodyInvalid("the request body must be a JSON object")
	}
	return decodeBytes(body, v)
}

// decodeReadError explains a failed body read.
func decodeReadError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return domain.Errorf(domain.CodeTooLarge, "the request body is over %d bytes", tooBig.Limit)
	}
	return bodyInvalid("could not read the request body")
}

// bodyInvalid is a 400 about the body as a whole (not JSON, not one object, more than
// one): its message, also listed in errors as the problem of the field "body", so that
// every 400 names what to fix.
func bodyInvalid(format string, args ...any) *domain.Error {
	msg := fmt.Sprintf(format, args...)
	return &domain.Error{Code: domain.CodeInvalid, Message: msg, Fields: []domain.FieldError{{Field: "body", Reason: msg}}}
}

// wholeBody says whether de is bodyInvalid's: a refusal of the body as a whole, whose
// fields were not read at all (a member named "body" is told as "body: …").
func wholeBody(de *domain.Error) bool {
	return len(de.Fields) == 1 && de.Fields[0].Field == "body" && de.Message == de.Fields[0].Reason
}

// member is one name and value of a JSON object, in the order of the body.
type member struct {
	name  string
	value json.RawMessage
}

// decodeBytes is decode's parser, also used by the fuzz tests. v is a pointer to a
// struct (fields by their json tags) or to a map. It reports every bad field at once:
// each member, array element and nested field is decoded on its own, so one wrong type
// does not hide the next, and every string is checked against the text rules
// (domain.TextProblem; strings of a field tagged `text:"multiline"` may hold tab,
// newline and carriage return).
func decodeBytes(body []byte, v any) error {
	if plainJSON(body) && strictUnmarshalOne(body, v) == nil {
		if _, twice, capital := scanNames(body); !twice && !capital {
			return nil // the common case, in one pass: no string in it can break the text rules
		}
	}
	reflect.ValueOf(v).Elem().SetZero()
	return decodeFields(body, v)
}

// decodeFields is decodeBytes field by field, for the bodies its one pass cannot take.
func decodeFields(body []byte, v any) error {
	rv := reflect.ValueOf(v).Elem()
	members, err := objectMembers(body)
	if err != nil {
		return err
	}
	var p domain.Problems
	if path, twice := memberTwice(body); twice {
		p.Add(path, "is given twice")
	}
	if rv.Kind() != reflect.Struct {
		decodeMap(&p, members, rv)
		return p.Err()
	}
	decodeObject(&p, "", members, rv)
	return p.Err()
}

// decodeMap decodes members into the map rv, each on its own, as decodeObject does a
// struct's: a member whose strings break the text rules is named and left out, and the
// others are still taken, so that a handler reading the map (a PATCH body, whose absent
// and null members differ) can name the problems of those too. A member given twice is
// taken twice: the last one wins, as encoding/json has it.
func decodeMap(p *domain.Problems, members []member, rv reflect.Value) {
	m := reflect.MakeMap(rv.Type())
	for _, mb := range members {
		if len(*p) >= maxProblems {
			break
		}
		before := len(*p)
		if checkText(p, mb.name, mb.value, false); len(*p) > before {
			continue
		}
		elem := reflect.New(rv.Type().Elem())
		if err := strictUnmarshal(mb.value, elem.Interface()); err != nil {
			p.Add(mb.name, fmt.Sprintf("must be %s, not %s", describe(elem.Elem().Type()), jsonKindOf(mb.value)))
			continue
		}
		m.SetMapIndex(reflect.ValueOf(mb.name).Convert(rv.Type().Key()), elem.Elem())
	}
	rv.Set(m)
}

// memberTwice finds the first member name given twice in one object of body, which is
// well-formed JSON, and returns its path ("depth", "options.elo", "items[2].fen"). Names
// are compared as the decoder matches them to fields: exactly, case and all ("depth"
// and "DEPTH" are two names, the second unknown). The decoders themselves would take
// the last one, so that {"depth":1,"depth":30} read as depth 30 where another parser
// reads 1.
func memberTwice(body []byte) (string, bool) {
	path, twice, _ := scanNames(body)
	return path, twice
}

// scanNames is memberTwice, also telling whether a member name holds an ASCII capital
// letter (for the one pass: goccy, like encoding/json, matches a name to a field
// without regard to case, and every field's name is in small letters, so that a name
// without a capital matches only the field of exactly its name; see plainJSON for the
// other characters).
//
// Its work is linear in the body, whatever the body's width or depth: each object's
// names go in a set (a list compared name by name took half a minute of CPU for a
// 1 MiB body of 125,000 names), and a path is built only for the name it reports (each
// open object holding its whole path took gigabytes for a body nested 9,500 deep).
func scanNames(body []byte) (path string, twice, capital bool) {
	type frame struct {
		textFrame                     // an object's latest name (key) and whether a name is next; an array's index
		names     map[string]struct{} // an object's names so far
	}
	var stack []frame
	for i := 0; i < len(body); i++ {
		switch c := body[i]; c {
		case '{', '[':
			stack = append(stack, frame{textFrame: textFrame{object: c == '{', wantKey: c == '{'}})
		case '}', ']':
			stack = stack[:len(stack)-1]
		case ',':
			if top := &stack[len(stack)-1]; top.object {
				top.wantKey = true
			} else {
				top.index++
			}
		case ':':
			stack[len(stack)-1].wantKey = false
		case '"':
			isName := len(stack) > 0 && stack[len(stack)-1].wantKey
			j, escaped := i+1, false
			for ; body[j] != '"'; j++ {
				if body[j] == '\\' {
					j, escaped = j+1, true
				}
			}
			if isName && !capital {
				// as written: a name with escapes never takes the one pass (plainJSON)
				capital = bytes.ContainsFunc(body[i+1:j], func(r rune) bool { return r >= 'A' && r <= 'Z' })
			}
			if isName {
				top := &stack[len(stack)-1]
				name := string(body[i+1 : j])
				if escaped || !utf8.ValidString(name) {
					// as the decoders read it: invalid UTF-8 as U+FFFD, byte by byte
					json.Unmarshal(body[i:j+1], &name) //nolint:errcheck // a checked string
				}
				top.key = name
				if _, seen := top.names[name]; seen {
					frames := make([]textFrame, len(stack))
					for k := range stack {
						frames[k] = stack[k].textFrame
					}
					return strings.TrimPrefix(textPath("", frames), "."), true, capital
				}
				if top.names == nil {
					top.names = map[string]struct{}{}
				}
				top.names[name] = struct{}{}
			}
			i = j
		}
	}
	return "", false, capital
}

// plainJSON reports whether body is an object made of printable ASCII and JSON white
// space without a backslash: then none of its strings can hold a control character,
// an escape or invalid UTF-8. Nor a run of more than 18 digits: goccy reads an integer
// past int64 without an error (9227000000000000000 into an int; FuzzDecodeBodies), and
// no number of 18 digits or fewer is past it. Nor null anywhere: goccy reads a null
// element of an array of strings as "", and a null member as absent or as its zero
// value, where the field decoder refuses both.
func plainJSON(body []byte) bool {
	body = bytes.TrimLeft(body, " \t\r\n")
	if len(body) == 0 || body[0] != '{' || bytes.Contains(body, []byte("null")) {
		return false
	}
	digits := 0
	for _, c := range body {
		if c == '\\' || c >= 0x7f || c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return false
		}
		if c < '0' || c > '9' {
			digits = 0
		} else if digits++; digits > 18 {
			return false
		}
	}
	return true
}

// strictUnmarshalOne decodes body, which must be one JSON value and nothing more, into
// v, refusing unknown fields. It is goccy/go-json's decoder, about twice as fast as
// encoding/json's on a request body (every costed call decodes one): what it accepts,
// the field-by-field decoder accepts the same way (FuzzDecodeBodies), and anything it
// refuses goes to that decoder, whose problems the client sees.
func strictUnmarshalOne(body []byte, v any) error {
	if !json.Valid(body) { // goccy checks less than it reads: a raw value may be malformed
		return errors.New("malformed JSON")
	}
	dec := gojson.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if off := dec.InputOffset(); off < 0 || off > int64(len(body)) || len(bytes.TrimLeft(body[off:], " \t\r\n")) > 0 {
		return errors.New("unexpected data after the JSON object")
	}
	return nil
}

// objectMembers checks that body is one JSON object and nothing more, and splits it.
func objectMembers(body []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return nil, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, bodyInvalid("unexpected data after the JSON object")
	}
	raw = bytes.TrimSpace(raw)
	if raw[0] != '{' {
		return nil, bodyInvalid("the request body must be a JSON object, not %s", jsonKindOf(raw))
	}
	return splitObject(raw), nil
}

// splitObject splits a JSON object already known to be well formed.
func splitObject(raw []byte) []member {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.Token() //nolint:errcheck // '{' of a checked object
	var out []member
	for dec.More() {
		name, _ := dec.Token()
		var m member
		m.name, _ = name.(string)
		dec.Decode(&m.value) //nolint:errcheck // a checked object
		m.value = bytes.TrimSpace(m.value)
		out = append(out, m)
	}
	return out
}

// splitArray splits a JSON array already known to be well formed.
func splitArray(raw []byte) []json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.Token() //nolint:errcheck // '[' of a checked array
	var out []json.RawMessage
	for dec.More() {
		var v json.RawMessage
		dec.Decode(&v) //nolint:errcheck // a checked array
		out = append(out, bytes.TrimSpace(v))
	}
	return out
}

// structField is one settable field of a request struct.
type structField struct {
	index     int
	multiline bool
}

// fieldsOf maps the JSON names of t's fields to the fields.
func fieldsOf(t reflect.Type) map[string]structField {
	out := map[string]structField{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = structField{index: i, multiline: f.Tag.Get("text") == "multiline"}
	}
	return out
}

// decodeObject decodes members into the struct rv, naming fields under prefix.
func decodeObject(p *domain.Problems, prefix string, members []member, rv reflect.Value) {
	fields := fieldsOf(rv.Type())
	for _, m := range members {
		if len(*p) >= maxProblems {
			return
		}
		path := prefix + m.name
		// the exact name only: encoding/json would also take a name differing in case
		// ("FEN", "\u017fhow_wdl" for show_wdl), which the document refuses
		f, ok := fields[m.name]
		if !ok {
			p.Add(path, "is not a known field")
			continue
		}
		if string(m.value) == "null" {
			// The document allows null for no member of a body read into a struct (a
			// PATCH body, read as a map, takes null where it means something): not read
			// as absent (nil), nor as the zero value ("reason":null as "", "label":null
			// as no label), which the client did not send.
			p.Add(path, fmt.Sprintf("must be %s, not null", describe(rv.Field(f.index).Type())))
			continue
		}
		decodeValue(p, path, m.value, rv.Field(f.index), f.multiline)
	}
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// decodeValue decodes raw into v, descending into objects and arrays so that each bad
// member or element is named on its own ("options.elo", "fens[3]"). Every string is
// checked against the text rules before it is decoded.
func decodeValue(p *domain.Problems, path string, raw json.RawMessage, v reflect.Value, multiline bool) {
	t := v.Type()
	custom := reflect.PointerTo(t).Implements(unmarshalerType)
	switch {
	case raw[0] == '"':
		if reason := jsonStringProblem(raw, multiline); reason != "" {
			p.Add(path, reason)
			return
		}
	case custom:
	case t.Kind() == reflect.Pointer && string(raw) != "null":
		elem := reflect.New(t.Elem())
		before := len(*p)
		decodeValue(p, path, raw, elem.Elem(), multiline)
		// An object is kept with the members it could take (each bad one left out, as
		// at the top level), so that a caller can check those too and name every
		// problem at once; any other value only when it was read.
		if len(*p) == before || t.Elem().Kind() == reflect.Struct && raw[0] == '{' {
			v.Set(elem)
		}
		return
	case t.Kind() == reflect.Struct && raw[0] == '{':
		decodeObject(p, path+".", splitObject(raw), v)
		return
	case t.Kind() == reflect.Slice && raw[0] == '[':
		elems := splitArray(raw)
		s := reflect.MakeSlice(t, len(elems), len(elems))
		for i, e := range elems {
			if len(*p) >= maxProblems {
				return
			}
			elemPath := fmt.Sprintf("%s[%d]", path, i)
			if string(e) == "null" && !nullable(t.Elem()) {
				// an element cannot be absent, and encoding/json would read null as
				// the zero value: a "" the client never sent, refused again later as
				// a FEN, a scope or a charge id (or taken as one)
				p.Add(elemPath, fmt.Sprintf("must be %s, not null", describe(t.Elem())))
				continue
			}
			decodeValue(p, elemPath, e, s.Index(i), multiline)
		}
		v.Set(s)
		return
	}
	before := len(*p)
	if checkText(p, path, raw, multiline); len(*p) > before {
		return // strings inside a value decoded whole (a map, a custom type)
	}
	if err := strictUnmarshal(raw, v.Addr().Interface()); err != nil {
		if fr, ok := errors.AsType[fieldReason](err); ok {
			p.Add(path, string(fr))
		} else {
			p.Add(path, fmt.Sprintf("must be %s, not %s", describe(t), jsonKindOf(raw)))
		}
		v.SetZero() // not what encoding/json left half-set (a pointer to false): left out
	}
}

// nullable says whether a value of type t can be null (nil), not just its zero value.
func nullable(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice:
		return true
	}
	return false
}

func strictUnmarshal(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	return dec.Decode(v)
}

// describe names what a field of type t takes, for a client.
func describe(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == reflect.TypeFor[decimal.Decimal]() {
		return `a decimal number (or a string such as "5.00")`
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// jsonKindOf names the kind of a JSON value, quoting short numbers.
func jsonKindOf(raw []byte) string {
	switch raw[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "true or false"
	case 'n':
		return "null"
	}
	if len(raw) > 24 {
		return "a number too long to quote"
	}
	return "the number " + string(raw)
}

// maxProblems bounds the field problems one body can produce: enough to fix a
// request, while a body of a million bad strings still gets a short answer.
const maxProblems = 50

// textFrame is one open object or array of checkText's walk.
type textFrame struct {
	object  bool
	wantKey bool   // object: the next token is a member name
	key     string // object: the current member's name
	index   int    // array: the current element's index
}

// checkText applies the text rules to every string in raw (object member names aside:
// an unknown name is refused anyway), adding a problem per bad string under its path.
// It walks raw once, whatever its nesting, and builds a path only for a problem.
func checkText(p *domain.Problems, path string, raw json.RawMessage, multiline bool) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	var stack []textFrame
	for len(*p) < maxProblems {
		start := dec.InputOffset()
		tok, err := dec.Token()
		if err != nil {
			return // io.EOF: raw is a checked value
		}
		if n := len(stack); n > 0 && stack[n-1].object && stack[n-1].wantKey {
			if name, ok := tok.(string); ok {
				stack[n-1].key, stack[n-1].wantKey = name, false
				continue
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, textFrame{object: tok == json.Delim('{'), wantKey: true})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		default:
			if _, ok := tok.(string); ok {
				lit := bytes.TrimLeft(raw[start:dec.InputOffset()], " \t\r\n,:")
				if reason := jsonStringProblem(lit, multiline); reason != "" {
					p.Add(textPath(path, stack), reason)
				}
			}
		}
		if n := len(stack); n > 0 { // a value of the enclosing object or array is done
			stack[n-1].wantKey = true
			stack[n-1].index++
		}
	}
}

// textPath names the value checkText is at, cut short for absurd nesting.
func textPath(root string, stack []textFrame) string {
	var b strings.Builder
	b.WriteString(root)
	for _, f := range stack {
		if b.Len() > 200 {
			b.WriteString("…")
			break
		}
		if f.object {
			b.WriteString("." + f.key)
		} else {
			fmt.Fprintf(&b, "[%d]", f.index)
		}
	}
	return b.String()
}

// jsonStringProblem decodes a well-formed JSON string literal exactly and applies the
// text rules to it. encoding/json would replace invalid UTF-8 and unpaired surrogate
// escapes with U+FFFD, silently changing what the client sent; the door refuses them.
func jsonStringProblem(lit []byte, multiline bool) string {
	s := lit[1 : len(lit)-1]
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				return fmt.Sprintf("is not valid UTF-8 (byte %d)", i)
			}
			b.Write(s[i : i+size])
			i += size
			continue
		}
		if s[i+1] != 'u' {
			b.WriteByte(unescape(s[i+1]))
			i += 2
			continue
		}
		r := hex4(s[i+2 : i+6])
		i += 6
		if utf16.IsSurrogate(r) {
			if r < 0xdc00 && i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
				if r2 := hex4(s[i+2 : i+6]); r2 >= 0xdc00 && r2 <= 0xdfff {
					b.WriteRune(utf16.DecodeRune(r, r2))
					i += 6
					continue
				}
			}
			return fmt.Sprintf("holds an unpaired surrogate escape \\u%04x, which is not a character", r)
		}
		b.WriteRune(r)
	}
	return domain.TextProblem(b.String(), multiline)
}

// unescape is the character a two-character escape such as \n stands for.
func unescape(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // \" \\ \/
}

func hex4(h []byte) rune {
	n, _ := strconv.ParseUint(string(h), 16, 32) // a checked literal: four hex digits
	return rune(n)
}

// jsonError turns encoding/json's errors into messages that name the field.
func jsonError(err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var fe *domain.Error
	switch {
	case errors.As(err, &fe):
		return fe
	case errors.As(err, &syntax):
		return bodyInvalid("malformed JSON at byte %d: %s", syntax.Offset, syntax.Error())
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return bodyInvalid("the request body must be a JSON object")
		}
		return domain.Invalid(field, fmt.Sprintf("must be %s, not %s", describe(typ.Type), typ.Value))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return bodyInvalid("the JSON body ends early")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return domain.Invalid(name, "is not a known field")
	}
	return bodyInvalid("invalid JSON: %s", err.Error())
}
