package domain

import (
	"encoding/base64"
	"strings"
	"time"
)

// PageCursor continues a list ordered newest first after the row it names: the row's
// time and, to order rows of the same time, its id. Clients carry it opaque.
type PageCursor struct {
	At time.Time
	ID string
}

// Encode is the cursor as the client carries it: opaque, URL-safe.
func (c PageCursor) Encode() string {
	return base64.RawURLEncoding.EncodeToString([]byte(c.At.UTC().Format(time.RFC3339Nano) + " " + c.ID))
}

// DecodePageCursor reads a cursor Encode made for ids starting with idPrefix ("job_");
// anything else is a 400 naming `cursor`.
func DecodePageCursor(s, idPrefix string) (PageCursor, error) {
	bad := Invalid("cursor", "is not a cursor this service handed out (use next_cursor as given)")
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return PageCursor{}, bad
	}
	at, id, ok := strings.Cut(string(raw), " ")
	t, err := time.Parse(time.RFC3339Nano, at)
	if !ok || err != nil || !strings.HasPrefix(id, idPrefix) || len(id) > 64 || !idText(id) {
		return PageCursor{}, bad
	}
	c := PageCursor{At: t, ID: id}
	if c.Encode() != s { // one spelling per cursor: an edited one is refused, not read otherwise
		return PageCursor{}, bad
	}
	return c, nil
}

// idText says whether id is spelled as the service's ids are (ASCII letters, digits,
// '_' and '-'): a cursor is read back into a query, where a NUL or invalid UTF-8 made
// PostgreSQL fail the list with a 500.
func idText(id string) bool {
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
