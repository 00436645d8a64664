package domain

import (
	"encoding/base64"
	"errors"
	"testing"
	"time"
)

// A cursor the service handed out reads back; anything else is a 400 naming cursor,
// ids that would reach the query as other than text (a NUL, invalid UTF-8) included.
func TestDecodePageCursor(t *testing.T) {
	at := time.Date(2026, 12, 6, 17, 0, 0, 123456789, time.UTC)
	good := PageCursor{At: at, ID: "job_0afmp0nHAOxtr1Dd0y39Y1"}.Encode()
	if c, err := DecodePageCursor(good, "job_"); err != nil || !c.At.Equal(at) || c.ID != "job_0afmp0nHAOxtr1Dd0y39Y1" {
		t.Fatalf("a cursor the service made: %+v, %v", c, err)
	}
	raw := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for name, s := range map[string]string{
		"not base64":          "%%%",
		"another id's prefix": PageCursor{At: at, ID: "dsp_x"}.Encode(),
		"no time":             raw("job_x"),
		"a NUL in the id":     raw("2024-01-01T00:00:00Z job_\x00"),
		"invalid UTF-8":       raw("2024-01-01T00:00:00Z job_\xff"),
		"a space in the id":   raw("2024-01-01T00:00:00Z job_a b"),
		"padded":              good + "==",
	} {
		_, err := DecodePageCursor(s, "job_")
		var de *Error
		if !errors.As(err, &de) || de.Code != CodeInvalid {
			t.Errorf("%s: %v, want a validation error", name, err)
		}
	}
}

// Whatever a client sends as a cursor is refused or read as one the service could
// have made: a time and an id of the prefix, spelled as ids are, that encode back to it.
func FuzzDecodePageCursor(f *testing.F) {
	f.Add(PageCursor{At: time.Unix(1, 5).UTC(), ID: "job_abc"}.Encode())
	f.Add(base64.RawURLEncoding.EncodeToString([]byte("2024-01-01T00:00:00Z job_\x00")))
	f.Fuzz(func(t *testing.T, s string) {
		c, err := DecodePageCursor(s, "job_")
		if err != nil {
			return
		}
		if !idText(c.ID) || c.Encode() != s {
			t.Fatalf("%q read as %+v", s, c)
		}
	})
}
