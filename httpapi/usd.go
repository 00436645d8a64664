package httpapi

import (
	"bytes"
	"encoding/json"
	"regexp"

	"github.com/shopspring/decimal"
)

// usdInput is a budget in US dollars as a request gives it: a JSON number, or a string
// of digits with at most 6 decimals (the OpenAPI document's USDInput). A decimal's own
// decoder also reads "1e3", "+5", ".5" and "-0", which the document refuses, and a
// request the document refuses is refused here too.
type usdInput decimal.Decimal

var usdText = regexp.MustCompile(`^[0-9]+(\.[0-9]{1,6})?$`)

// fieldReason is a decoding error that is a field's whole reason (decode names the
// field with it as it stands).
type fieldReason string

func (r fieldReason) Error() string { return string(r) }

// errUSDText is why a value is not a USD amount.
const errUSDText = fieldReason(`must be a number, or a string of digits with at most 6 decimals such as "5.00"`)

func (u *usdInput) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil || !usdText.MatchString(s) {
			return errUSDText
		}
		b = []byte(s)
	} else if bytes.Equal(b, []byte("null")) {
		return nil
	}
	var d decimal.Decimal
	if err := d.UnmarshalJSON(b); err != nil {
		return errUSDText
	}
	*u = usdInput(d)
	return nil
}

// decimalOf is u as a decimal; nil for nil.
func (u *usdInput) decimalOf() *decimal.Decimal {
	if u == nil {
		return nil
	}
	d := decimal.Decimal(*u)
	return &d
}
