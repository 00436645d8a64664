package position

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParsePGNOneGameOnly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		pgn      string
		maxPlies int
		reason   string // "" when the PGN is one game and accepted
	}{
		{"two games with results", "[Event \"a\"]\n1. e4 e5 1-0\n\n[Event \"b\"]\n1. d4 d5 0-1\n", 0, "holds 2 games"},
		{"three games", "1. e4 * 1. d4 * 1. c4 *", 0, "holds 3 games"},
		{"second game after a result, no tags", "1. e4 e5 1/2-1/2 1. d4", 0, "holds 2 games"},
		{"first game without a result", "[Event \"a\"]\n1. e4 e5\n\n[Event \"b\"]\n1. d4 *", 0, "holds 2 games"},
		{"second game past the plies read", "1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 1-0\n[Event \"b\"] 1. d4 *", 2, "holds 2 games"},
		{"one game past the plies read", "1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 1-0 {end}", 2, ""},
		{"comments after the result", "1. e4 e5 1-0 {annotator's note} ; more\n", 0, ""},
		{"tags only after a result", "1. e4 * [Event \"b\"]", 0, "holds 2 games"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, err := ParsePGN(tt.pgn, false, tt.maxPlies)
			if tt.reason == "" {
				if err != nil || g == nil {
					t.Fatalf("ParsePGN(%q) = %v", tt.pgn, err)
				}
				return
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Field != "pgn" || !strings.Contains(pe.Reason, tt.reason) {
				t.Fatalf("ParsePGN(%q) error = %v, want reason containing %q", tt.pgn, err, tt.reason)
			}
		})
	}
}

func TestParsePGNText(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		pgn    string
		reason string // "" when accepted
	}{
		{"NUL in a tag", "[Event \"a\x00b\"]\n1. e4 *", "control character U+0000"},
		{"escape in movetext", "1. e4 \x1b[31m e5 *", "control character U+001B"},
		{"form feed", "1. e4\fe5 *", "control character U+000C"},
		{"DEL", "[Site \"\x7f\"] 1. e4 *", "control character U+007F"},
		{"C1 control", "[Site \"\u0085\"] 1. e4 *", "control character U+0085"},
		{"invalid UTF-8", "[Site \"\xff\"] 1. e4 *", "not valid UTF-8"},
		{"tabs, CRLF and accents", "[White \"Réti\"]\r\n[Black\t\"Ñ\"]\r\n1.\te4 e5 *\r\n", ""},
		// A long token is shortened at a character's start, not inside '€'.
		{"long token of non-ASCII", "1. e4 e5 2. Ke€€€€€€€€ *", `ply 3 (2. Ke€€€€...): `},
		{"long variant of non-ASCII", "[Variant \"ab€€€€€€€€\"] 1. e4 *", `variant "ab€€€€..." is not supported`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ParsePGN(tt.pgn, false, 0)
			if tt.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != CodeInvalidPGN || !strings.Contains(pe.Reason, tt.reason) || !utf8.ValidString(pe.Reason) {
				t.Fatalf("ParsePGN(%q) error = %v, want reason containing %q", tt.pgn, err, tt.reason)
			}
		})
	}
}
