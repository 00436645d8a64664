package domain

import (
	"fmt"
	"unicode/utf8"
)

// Text rules (decisions.md, Text): every string the service stores is valid UTF-8
// without NUL or other control characters, under a length cap per field. PostgreSQL
// refuses NUL in text, so a NUL that reached an event would stop the projection that
// meets it; the rules are checked at the door, and again by the constructors of the
// events, so nothing that breaks them is ever appended.

// Length caps of the stored fields, in characters (Unicode code points) unless said.
const (
	MaxEmailLength = 254 // bytes: RFC 5321's path limit
	MaxNameLength  = 200 // signup name, agent and source
	MaxLabelLength = 100 // key label
)

// TextProblem says what is wrong with s as stored text, "" when nothing is. Control
// characters are C0 (U+0000–U+001F), DEL (U+007F) and C1 (U+0080–U+009F): none of them
// prints, and DEL and C1 are as invisible in a log or a terminal as C0. multiline
// allows tab, newline and carriage return, for formats that need them (PGN).
func TextProblem(s string, multiline bool) string {
	if !utf8.ValidString(s) {
		for i, r := range s {
			if r == utf8.RuneError {
				if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
					return fmt.Sprintf("is not valid UTF-8 (byte %d)", i)
				}
			}
		}
	}
	for i, r := range s {
		if IsControl(r) && !(multiline && (r == '\t' || r == '\n' || r == '\r')) {
			return fmt.Sprintf("holds the control character %U at byte %d; control characters are not allowed", r, i)
		}
	}
	return ""
}

// IsControl reports whether r is a C0 or C1 control character or DEL.
func IsControl(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }

// CheckText adds a problem for field when s breaks the text rules or is longer than
// maxLen characters (0: no cap here).
func CheckText(p *Problems, field, s string, maxLen int) {
	if reason := TextProblem(s, false); reason != "" {
		p.Add(field, reason)
		return
	}
	if maxLen > 0 && utf8.RuneCountInString(s) > maxLen {
		p.Add(field, fmt.Sprintf("is longer than %d characters", maxLen))
	}
}
