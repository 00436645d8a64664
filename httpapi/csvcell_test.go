package httpapi

import "testing"

func TestCSVCell(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"req_0123", "req_0123"},
		{"=HYPERLINK(\"http://x\",\"y\")", "'=HYPERLINK(\"http://x\",\"y\")"},
		{"@SUM(A1)", "'@SUM(A1)"},
		{"+A1", "'+A1"},
		{"-A1", "'-A1"},
		{"-2+3", "'-2+3"},
		{"\tcmd", "'\tcmd"},
		{"\r=1", "'\r=1"},
		{"-0.000100", "-0.000100"},
		{"+12", "+12"},
		{"10", "10"},
		{"a=b", "a=b"},
	} {
		if got := csvCell(tc.in); got != tc.want {
			t.Errorf("csvCell(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
