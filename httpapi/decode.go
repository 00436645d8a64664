package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"chessd/domain"
)

// decode reads exactly one JSON object into v, refusing unknown fields, trailing data
// and bodies over the limit. An empty body is allowed only when optional is true.
func decode(r *http.Request, v any, optional bool) error {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return decodeReadError(err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if optional {
			return nil
		}
		return domain.Errorf(domain.CodeInvalid, "the request body must be a JSON object")
	}
	return decodeBytes(body, v)
}

// decodeReadError explains a failed body read.
func decodeReadError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return domain.Errorf(domain.CodeTooLarge, "the request body is over %d bytes", tooBig.Limit)
	}
	return domain.Errorf(domain.CodeInvalid, "could not read the request body")
}

// decodeBytes is decode's parser, also used by the fuzz tests.
func decodeBytes(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return domain.Errorf(domain.CodeInvalid, "unexpected data after the JSON object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return domain.Errorf(domain.CodeInvalid, "unexpected data after the JSON object")
	}
	return nil
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
		return domain.Errorf(domain.CodeInvalid, "malformed JSON at byte %d: %s", syntax.Offset, syntax.Error())
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return domain.Errorf(domain.CodeInvalid, "the request body must be a JSON object")
		}
		return domain.Invalid(field, fmt.Sprintf("must be %s, not %s", jsonKind(typ.Type.Kind().String()), typ.Value))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return domain.Errorf(domain.CodeInvalid, "the JSON body ends early")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return domain.Invalid(name, "is not a known field")
	}
	return domain.Errorf(domain.CodeInvalid, "invalid JSON: %s", err.Error())
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int32", "int64":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return "a " + goKind
}
