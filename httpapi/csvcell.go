package httpapi

import "strconv"

// csvCell keeps a text cell of a CSV download from being read as a formula by a
// spreadsheet (CSV injection): a cell that starts with = @ tab or CR, or with + or -
// and is not a number, gets a leading apostrophe, which spreadsheets show as text.
// Request ids (the client may choose them), credit reasons (a dispute's words) and
// labels reach these files; numbers, negative ones included, pass unchanged.
func csvCell(s string) string {
	if s == "" {
		return s
	}
	switch s[0] {
	case '=', '@', '\t', '\r':
		return "'" + s
	case '+', '-':
		if _, err := strconv.ParseFloat(s, 64); err != nil {
			return "'" + s
		}
	}
	return s
}

// csvCells is csvCell of each value, in a new slice.
func csvCells(vs []string) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = csvCell(v)
	}
	return out
}
